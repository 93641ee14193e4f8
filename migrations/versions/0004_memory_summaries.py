"""Long-term memory: summaries (per conversation, per day, per month), the tenant profile's facts, topics.

- ``memory_summaries``: one row per (conversation, kind, period). ``kind``: ``conversation`` (B4, period ''),
  ``day`` (period 'YYYY-MM-DD'), ``month`` (period 'YYYY-MM'), ``profile`` (the profile job's progress,
  period ''). ``status`` is the archive flag of the messages the row covers: ``pending`` while the summary is
  being made (those messages may not be pruned), ``done`` once it exists (``true`` in seed 001's terms); a
  message of a day without a row is unarchived (``false``). ``attempts`` / ``next_attempt_at`` / ``last_error``
  drive the exponential back-off of failed summaries. ``last_seq``: for ``conversation`` / ``profile``, the
  last entry of the archived pages already taken in.
- ``memory_topics``: keywords per archived page (``number``) and per conversation (``number`` ''), GIN index.
- ``memory_profile_facts``: stable facts about the tenant, each learnt from one conversation (deleting the
  conversation deletes what was learnt from it).

Revision ID: 0004_memory_summaries
Revises: 0003_memory_vectors
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision: str = "0004_memory_summaries"
down_revision: str | None = "0003_memory_vectors"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _conversation_fk(table: str) -> sa.Column:
    return sa.Column(
        "conversation_id",
        sa.Text(),
        sa.ForeignKey("conversations.id", ondelete="CASCADE", name=f"fk_{table}_conversation_id_conversations"),
        nullable=False,
    )


def _stamp(name: str) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def upgrade() -> None:
    op.create_table(
        "memory_summaries",
        _conversation_fk("memory_summaries"),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("period", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("tokens", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("first_seq", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_seq", sa.Integer(), nullable=False, server_default=sa.text("-1")),
        sa.Column("message_count", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("compressions", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True)),
        sa.Column("last_error", sa.Text()),
        _stamp("created_at"),
        _stamp("updated_at"),
        sa.PrimaryKeyConstraint("conversation_id", "kind", "period", name="pk_memory_summaries"),
        sa.CheckConstraint(
            "kind IN ('conversation', 'day', 'month', 'profile')", name="ck_memory_summaries_kind"
        ),
        sa.CheckConstraint("status IN ('pending', 'done')", name="ck_memory_summaries_status"),
    )
    op.create_index("ix_memory_summaries_next_attempt_at", "memory_summaries", ["next_attempt_at"])
    op.create_table(
        "memory_topics",
        _conversation_fk("memory_topics"),
        sa.Column("number", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("topics", ARRAY(sa.Text()), nullable=False, server_default=sa.text("'{}'::text[]")),
        _stamp("updated_at"),
        sa.PrimaryKeyConstraint("conversation_id", "number", name="pk_memory_topics"),
    )
    op.create_index("ix_memory_topics_topics", "memory_topics", ["topics"], postgresql_using="gin")
    op.create_table(
        "memory_profile_facts",
        _conversation_fk("memory_profile_facts"),
        sa.Column("digest", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("fact", sa.Text(), nullable=False),
        _stamp("created_at"),
        sa.PrimaryKeyConstraint("conversation_id", "digest", name="pk_memory_profile_facts"),
    )
    op.create_index("ix_memory_profile_facts_tenant_created_at", "memory_profile_facts", ["tenant", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_memory_profile_facts_tenant_created_at", table_name="memory_profile_facts")
    op.drop_table("memory_profile_facts")
    op.drop_index("ix_memory_topics_topics", table_name="memory_topics")
    op.drop_table("memory_topics")
    op.drop_index("ix_memory_summaries_next_attempt_at", table_name="memory_summaries")
    op.drop_table("memory_summaries")
