"""response_chains: the messages behind each stored answer of the Responses API (``previous_response_id``).

A client of the Responses API may send only its new input items and name the answer it continues; the proxy keeps
each stored answer's messages (the request's new ones and the answer's own, as chat messages) and the id of the
answer before it, and rebuilds the whole conversation from the chain.

Revision ID: 0008_response_chains
Revises: 0007_active_pages_unindexed
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008_response_chains"
down_revision: str | None = "0007_active_pages_unindexed"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "response_chains",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("previous_id", sa.Text()),
        sa.Column("messages", JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_response_chains"),
    )


def downgrade() -> None:
    op.drop_table("response_chains")
