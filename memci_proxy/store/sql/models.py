"""SQLAlchemy 2 table models matching the Alembic migrations.

The schema is created only by the migrations (``migrations/versions``); these models are what the
repository queries with. A test compares the two so they cannot drift apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR
from sqlalchemy.dialects.postgresql import base as postgresql_base
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import UserDefinedType

# Text-search configuration of pages.tsv; queries must use the same one (to_tsquery(TSV_CONFIG, ...)).
TSV_CONFIG = "simple"

PAGE_STATES = ("active", "archived", "evicted")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Vector(UserDefinedType):
    """pgvector's ``vector`` without a fixed dimension (values are bound as text: '[1,2,3]')."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "vector"


# Reflection (Alembic's schema comparison) then knows the column type instead of warning about it.
postgresql_base.ischema_names.setdefault("vector", Vector)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSONB}


def _created_at() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


def _conversation_fk() -> Mapped[str]:
    return mapped_column(Text, ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)


class Conversation(Base):
    __tablename__ = "conversations"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    session_key: Mapped[str | None] = mapped_column(Text)
    # the end user's keyed hash (memci_proxy.turn.end_user); NULL: no user id, nothing of it leaves the conversation
    end_user: Mapped[str | None] = mapped_column(Text)
    parent_id: Mapped[str | None] = mapped_column(Text)
    forked_at: Mapped[int | None] = mapped_column(Integer)
    label: Mapped[str | None] = mapped_column(Text)
    state: Mapped[bytes | None] = mapped_column(LargeBinary)
    state_version: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    last_active_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), nullable=False, server_default=func.now()
    )

    __table_args__ = (
        Index(
            "uq_conversations_tenant_session_key",
            "tenant",
            "session_key",
            unique=True,
            postgresql_where=text("session_key IS NOT NULL"),
        ),
        Index("ix_conversations_tenant_last_active_at", "tenant", "last_active_at"),
        Index("ix_conversations_tenant_end_user_last_active_at", "tenant", "end_user", "last_active_at",
              postgresql_where=text("end_user IS NOT NULL")),
    )


class Entry(Base):
    __tablename__ = "entries"

    conversation_id: Mapped[str] = _conversation_fk()
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    hash: Mapped[str] = mapped_column(Text, nullable=False)
    role: Mapped[str] = mapped_column(Text, nullable=False)
    message: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    created_at: Mapped[datetime] = _created_at()


class Page(Base):
    __tablename__ = "pages"

    conversation_id: Mapped[str] = _conversation_fk()
    number: Mapped[str] = mapped_column(Text, primary_key=True)
    first_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    last_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    summary: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    recall_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    last_recalled_turn: Mapped[int | None] = mapped_column(Integer)
    archived_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _created_at()
    # Maintained by the trigger pages_tsv (summary weight A, message text weight B); NULL while the page is active.
    tsv: Mapped[Any | None] = mapped_column(TSVECTOR)

    __table_args__ = (
        CheckConstraint("state IN ('active', 'archived', 'evicted')", name="state"),
        Index("ix_pages_tsv", "tsv", postgresql_using="gin"),
        Index("ix_pages_conversation_id_state", "conversation_id", "state"),
        # the non-active pages whose tsvector is still to be computed (indexed behind an epoch's answer: 0010)
        Index("ix_pages_unindexed", "conversation_id", postgresql_where=text("tsv IS NULL AND state <> 'active'")),
    )


class Fingerprint(Base):
    __tablename__ = "fingerprints"

    tenant: Mapped[str] = mapped_column(Text, primary_key=True)
    chain_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    conversation_id: Mapped[str] = mapped_column(
        Text, ForeignKey("conversations.id", ondelete="CASCADE"), nullable=False
    )
    length: Mapped[int] = mapped_column(Integer, nullable=False)

    __table_args__ = (Index("ix_fingerprints_conversation_id", "conversation_id"),)


class HiddenMessage(Base):
    __tablename__ = "hidden_messages"

    conversation_id: Mapped[str] = _conversation_fk()
    after_seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer, primary_key=True)
    message: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = _created_at()


class ContentsSnapshot(Base):
    __tablename__ = "contents_snapshots"

    conversation_id: Mapped[str] = _conversation_fk()
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = _created_at()


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    conversation_id: Mapped[str | None] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _created_at()

    __table_args__ = (
        Index("ix_events_conversation_id_created_at", "conversation_id", "created_at"),
        Index("ix_events_kind", "kind"),
    )


class MemoryVector(Base):
    """A page's embedding by one model (migration 0003; HNSW indexes per dimension are made at run time)."""

    __tablename__ = "memory_vectors"

    conversation_id: Mapped[str] = _conversation_fk()
    number: Mapped[str] = mapped_column(Text, primary_key=True)
    model: Mapped[str] = mapped_column(Text, primary_key=True)
    dim: Mapped[int] = mapped_column(Integer, nullable=False)
    digest: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    embedding: Mapped[Any] = mapped_column(Vector(), nullable=False)
    created_at: Mapped[datetime] = _created_at()

    __table_args__ = (CheckConstraint("dim = vector_dims(embedding)", name="dim"),)


class BlobRef(Base):
    """An image's bytes (by sha256 ``key``) sent in a conversation: what a tenant may read, and what deleting the
    conversation deletes (migration 0005)."""

    __tablename__ = "blob_refs"

    conversation_id: Mapped[str] = _conversation_fk()
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = _created_at()

    __table_args__ = (Index("ix_blob_refs_tenant_key", "tenant", "key"), Index("ix_blob_refs_key", "key"))


class VirtualKeyRow(Base):
    """A client key (its sha256 only) mapped to a tenant and an upstream key, with its limits (migration 0005)."""

    __tablename__ = "virtual_keys"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    key_hash: Mapped[str] = mapped_column(Text, nullable=False)
    key_hint: Mapped[str] = mapped_column(Text, nullable=False)
    previous_key_hash: Mapped[str | None] = mapped_column(Text)
    previous_valid_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    name: Mapped[str | None] = mapped_column(Text)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    upstream_key: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("''"))
    rate_limit_rps: Mapped[float | None] = mapped_column(Float)
    rate_limit_burst: Mapped[int | None] = mapped_column(Integer)
    budget_tokens: Mapped[int | None] = mapped_column(BigInteger)
    used_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    source: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("'api'"))
    created_at: Mapped[datetime] = _created_at()
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    end_user: Mapped[str | None] = mapped_column(Text)  # the keyed hash of the end user it is bound to (0009)

    __table_args__ = (
        UniqueConstraint("key_hash", name="uq_virtual_keys_key_hash"),
        CheckConstraint("source IN ('api', 'settings')", name="source"),
        Index("ix_virtual_keys_previous_key_hash", "previous_key_hash"),
        Index("ix_virtual_keys_tenant", "tenant"),
    )


class ResponseChainRow(Base):
    """One stored answer of the Responses API: the messages it added, and the answer it continued (migration 0008)."""

    __tablename__ = "response_chains"

    id: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    previous_id: Mapped[str | None] = mapped_column(Text)
    messages: Mapped[Any] = mapped_column(JSONB, nullable=False)
    created_at: Mapped[datetime] = _created_at()
