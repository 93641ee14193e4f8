"""Page embeddings for the vector half of the recall search.

One row per (conversation, page, embedding model). The column is ``vector`` without a fixed dimension so
that any model fits; an HNSW index needs a fixed dimension, so it is created at run time, once the
dimension is known, as an expression index restricted to that dimension (pgvector's documented way to
index a column holding several dimensions)::

    CREATE INDEX ix_memory_vectors_hnsw_<dim> ON memory_vectors
        USING hnsw ((embedding::vector(<dim>)) vector_cosine_ops) WHERE dim = <dim>

(``memci_proxy.store.sql.vector_queries.ensure_vector_index``). ``digest`` identifies the text that was embedded,
so a page whose text changed is embedded again and an unchanged one never is.

Revision ID: 0003_memory_vectors
Revises: 0002_entries_touch_pages
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_memory_vectors"
down_revision: str | None = "0002_entries_touch_pages"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


class _Vector(sa.types.UserDefinedType):
    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "vector"


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "memory_vectors",
        sa.Column(
            "conversation_id",
            sa.Text(),
            sa.ForeignKey(
                "conversations.id", ondelete="CASCADE", name="fk_memory_vectors_conversation_id_conversations"
            ),
            nullable=False,
        ),
        sa.Column("number", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("digest", sa.Text(), nullable=False, server_default=sa.text("''")),
        sa.Column("embedding", _Vector(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("conversation_id", "number", "model", name="pk_memory_vectors"),
        sa.CheckConstraint("dim = vector_dims(embedding)", name="ck_memory_vectors_dim"),
    )


def downgrade() -> None:
    op.drop_table("memory_vectors")  # drops the run-time HNSW indexes with it
