"""Initial schema: conversations, entries, pages, fingerprints, hidden messages, contents snapshots, events.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TSV_CONFIG = "simple"  # memci_proxy.store.sql.models.TSV_CONFIG at the time of this revision

# pages.tsv = summary (weight A) + the text of the page's messages (content, tool calls; weight B).
# Recomputed only when the summary or the page's range changes (not on recall-count updates).
PAGES_TSV_FUNCTION = f"""
CREATE OR REPLACE FUNCTION memci_pages_tsv() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND NEW.summary IS NOT DISTINCT FROM OLD.summary
       AND NEW.first_seq = OLD.first_seq
       AND NEW.last_seq = OLD.last_seq
       AND NEW.tsv IS NOT DISTINCT FROM OLD.tsv THEN
        RETURN NEW;
    END IF;
    NEW.tsv := setweight(to_tsvector('{TSV_CONFIG}', coalesce(NEW.summary, '')), 'A')
        || setweight(coalesce((
            SELECT jsonb_to_tsvector(
                '{TSV_CONFIG}',
                jsonb_agg(jsonb_build_array(e.message -> 'content', e.message -> 'tool_calls') ORDER BY e.seq),
                '["string"]')
            FROM entries e
            WHERE e.conversation_id = NEW.conversation_id
              AND e.seq BETWEEN NEW.first_seq AND NEW.last_seq
        ), ''::tsvector), 'B');
    RETURN NEW;
END
$$;
"""


def _created_at() -> sa.Column:
    return sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def _conversation_fk(table: str) -> sa.Column:
    """conversation_id referencing conversations, rows removed with their conversation."""
    return sa.Column(
        "conversation_id",
        sa.Text(),
        sa.ForeignKey("conversations.id", ondelete="CASCADE", name=f"fk_{table}_conversation_id_conversations"),
        nullable=False,
    )


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")

    op.create_table(
        "conversations",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("session_key", sa.Text(), nullable=True),
        sa.Column("parent_id", sa.Text(), nullable=True),
        sa.Column("forked_at", sa.Integer(), nullable=True),
        sa.Column("label", sa.Text(), nullable=True),
        sa.Column("state", sa.LargeBinary(), nullable=True),
        sa.Column("state_version", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        _created_at(),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("last_active_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_conversations"),
    )
    op.create_index(
        "uq_conversations_tenant_session_key",
        "conversations",
        ["tenant", "session_key"],
        unique=True,
        postgresql_where=sa.text("session_key IS NOT NULL"),
    )
    op.create_index("ix_conversations_tenant_last_active_at", "conversations", ["tenant", "last_active_at"])

    op.create_table(
        "entries",
        _conversation_fk("entries"),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("message", postgresql.JSONB(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("conversation_id", "seq", name="pk_entries"),
    )

    op.create_table(
        "pages",
        _conversation_fk("pages"),
        sa.Column("number", sa.Text(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("recall_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_recalled_turn", sa.Integer(), nullable=True),
        sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True),
        _created_at(),
        sa.Column("tsv", postgresql.TSVECTOR(), nullable=True),
        sa.PrimaryKeyConstraint("conversation_id", "number", name="pk_pages"),
        sa.CheckConstraint("state IN ('active', 'archived', 'evicted')", name="ck_pages_state"),
    )
    op.create_index("ix_pages_tsv", "pages", ["tsv"], postgresql_using="gin")
    op.create_index("ix_pages_conversation_id_state", "pages", ["conversation_id", "state"])
    op.execute(PAGES_TSV_FUNCTION)
    op.execute(
        "CREATE TRIGGER pages_tsv BEFORE INSERT OR UPDATE ON pages "
        "FOR EACH ROW EXECUTE FUNCTION memci_pages_tsv()"
    )

    op.create_table(
        "fingerprints",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("chain_hash", sa.Text(), nullable=False),
        _conversation_fk("fingerprints"),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "chain_hash", name="pk_fingerprints"),
    )
    op.create_index("ix_fingerprints_conversation_id", "fingerprints", ["conversation_id"])

    op.create_table(
        "hidden_messages",
        _conversation_fk("hidden_messages"),
        sa.Column("after_seq", sa.Integer(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("message", postgresql.JSONB(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("conversation_id", "after_seq", "ordinal", name="pk_hidden_messages"),
    )

    op.create_table(
        "contents_snapshots",
        _conversation_fk("contents_snapshots"),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("conversation_id", "epoch", name="pk_contents_snapshots"),
    )

    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),  # BIGSERIAL
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("conversation_id", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_conversation_id_created_at", "events", ["conversation_id", "created_at"])
    op.create_index("ix_events_kind", "events", ["kind"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("contents_snapshots")
    op.drop_table("hidden_messages")
    op.drop_table("fingerprints")
    op.execute("DROP TRIGGER IF EXISTS pages_tsv ON pages")
    op.drop_table("pages")
    op.execute("DROP FUNCTION IF EXISTS memci_pages_tsv()")
    op.drop_table("entries")
    op.drop_table("conversations")
    # The vector extension is left installed: other schemas in the database may use it, and
    # dropping it needs privileges a migration role may not have.
