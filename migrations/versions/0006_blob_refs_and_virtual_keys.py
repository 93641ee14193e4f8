"""Blob ownership per tenant and conversation, and virtual keys managed through the admin API.

- ``blob_refs``: which conversation (and so which tenant) sent the bytes of an image. Image bytes are stored
  once per hash underneath; a tenant may read (describe, resolve) stored bytes only while one of its
  conversations references them, and deleting the last conversation that references them deletes them.
- ``virtual_keys``: client keys (only their sha256 is kept) mapped to a tenant and an upstream key, with a
  per-key rate limit and an optional budget in tokens. Keys in the settings are seeded into this table at
  start-up (``source = 'settings'``).

Revision ID: 0006_blob_refs_and_virtual_keys
Revises: 0005_save_turns_function
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_blob_refs_and_virtual_keys"
down_revision: str | None = "0005_save_turns_function"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _stamp(name: str, nullable: bool = False) -> sa.Column:
    if nullable:
        return sa.Column(name, sa.DateTime(timezone=True))
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now())


def upgrade() -> None:
    op.create_table(
        "blob_refs",
        sa.Column(
            "conversation_id",
            sa.Text(),
            sa.ForeignKey("conversations.id", ondelete="CASCADE", name="fk_blob_refs_conversation_id_conversations"),
            nullable=False,
        ),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        _stamp("created_at"),
        sa.PrimaryKeyConstraint("conversation_id", "key", name="pk_blob_refs"),
    )
    op.create_index("ix_blob_refs_tenant_key", "blob_refs", ["tenant", "key"])
    op.create_index("ix_blob_refs_key", "blob_refs", ["key"])
    op.create_table(
        "virtual_keys",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("key_hash", sa.Text(), nullable=False),
        sa.Column("key_hint", sa.Text(), nullable=False),
        sa.Column("previous_key_hash", sa.Text()),
        _stamp("previous_valid_until", nullable=True),
        sa.Column("name", sa.Text()),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("upstream_key", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("rate_limit_rps", sa.Float()),
        sa.Column("rate_limit_burst", sa.Integer()),
        sa.Column("budget_tokens", sa.BigInteger()),
        sa.Column("used_tokens", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("source", sa.Text(), nullable=False, server_default=sa.text("'api'")),
        _stamp("created_at"),
        _stamp("updated_at"),
        _stamp("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_virtual_keys"),
        sa.UniqueConstraint("key_hash", name="uq_virtual_keys_key_hash"),
        sa.CheckConstraint("source IN ('api', 'settings')", name="ck_virtual_keys_source"),
    )
    op.create_index("ix_virtual_keys_previous_key_hash", "virtual_keys", ["previous_key_hash"])
    op.create_index("ix_virtual_keys_tenant", "virtual_keys", ["tenant"])


def downgrade() -> None:
    op.drop_index("ix_virtual_keys_tenant", table_name="virtual_keys")
    op.drop_index("ix_virtual_keys_previous_key_hash", table_name="virtual_keys")
    op.drop_table("virtual_keys")
    op.drop_index("ix_blob_refs_key", table_name="blob_refs")
    op.drop_index("ix_blob_refs_tenant_key", table_name="blob_refs")
    op.drop_table("blob_refs")
