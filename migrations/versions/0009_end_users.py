"""End users: whose memory a conversation is (conversations.end_user, memory_profile_facts.end_user), and the
index of each end user's pages across their conversations (user_pages).

A tenant is an app; the end user is the person the client names (X-Memci-User, safety_identifier, user, Anthropic
metadata.user_id), stored as a keyed hash per tenant. The profile (B2a) is learnt and served per end user, and per
conversation when the request names none; existing rows keep NULL (no user: their conversation's own).
user_pages holds each page of an end user's conversations (active ones too: a short conversation is memory as well)
with its text, its terms as a tsvector whose lexemes carry the user's key ("<key>.<term>"): a GIN lookup is then
one user's postings, whatever the number of users (an index per user, never a scan of their history), and its BM25
term counts and length (a search ranks its candidates from those, reading the text of its hits alone).
virtual_keys.end_user: the keyed hash of the one end user a virtual key is bound to (NULL: a key of the whole tenant).

Revision ID: 0009_end_users
Revises: 0008_response_chains
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR

revision: str = "0009_end_users"
down_revision: str | None = "0008_response_chains"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("end_user", sa.Text()))
    op.create_index("ix_conversations_tenant_end_user_last_active_at", "conversations",
                    ["tenant", "end_user", "last_active_at"], postgresql_where=sa.text("end_user IS NOT NULL"))
    op.add_column("memory_profile_facts", sa.Column("end_user", sa.Text()))
    op.create_index("ix_memory_profile_facts_tenant_end_user_created_at", "memory_profile_facts",
                    ["tenant", "end_user", "created_at"], postgresql_where=sa.text("end_user IS NOT NULL"))
    op.create_table(
        "user_pages",
        sa.Column("conversation_id", sa.Text(), nullable=False),
        sa.Column("number", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("end_user", sa.Text(), nullable=False),
        sa.Column("first_seq", sa.Integer(), nullable=False),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("terms", TSVECTOR(), nullable=False),
        sa.Column("counts", JSONB(), nullable=False),
        sa.Column("length", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.ForeignKeyConstraint(["conversation_id"], ["conversations.id"], ondelete="CASCADE",
                                name="fk_user_pages_conversation_id_conversations"),
        sa.PrimaryKeyConstraint("conversation_id", "number", name="pk_user_pages"),
    )
    op.create_index("ix_user_pages_terms", "user_pages", ["terms"], postgresql_using="gin")
    op.create_index("ix_user_pages_tenant_end_user_seen_at", "user_pages", ["tenant", "end_user", "seen_at"])
    op.add_column("virtual_keys", sa.Column("end_user", sa.Text()))


def downgrade() -> None:
    op.drop_column("virtual_keys", "end_user")
    op.drop_table("user_pages")
    op.drop_index("ix_memory_profile_facts_tenant_end_user_created_at", table_name="memory_profile_facts")
    op.drop_column("memory_profile_facts", "end_user")
    op.drop_index("ix_conversations_tenant_end_user_last_active_at", table_name="conversations")
    op.drop_column("conversations", "end_user")
