"""End users: whose memory a conversation is (conversations.end_user, memory_profile_facts.end_user).

A tenant is an app; the end user is the person the client names (X-Memci-User, safety_identifier, user, Anthropic
metadata.user_id), stored as a keyed hash per tenant. The profile (B2a) is learnt and served per end user, and per
conversation when the request names none; existing rows keep NULL (no user: their conversation's own).

Revision ID: 0009_end_users
Revises: 0008_response_chains
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

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


def downgrade() -> None:
    op.drop_index("ix_memory_profile_facts_tenant_end_user_created_at", table_name="memory_profile_facts")
    op.drop_column("memory_profile_facts", "end_user")
    op.drop_index("ix_conversations_tenant_end_user_last_active_at", table_name="conversations")
    op.drop_column("conversations", "end_user")
