"""Table models of the long-term memory (migration 0004; 0009: whose facts): summaries, topics, the end user's
profile facts.

They are declared on the shared ``Base`` so that the schema test compares them with the migrations; the
repository imports them through ``memory_queries``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, Index, Integer, Text, func
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlalchemy.orm import Mapped, mapped_column

from memci_proxy.store.sql.models import Base

USER_TERMS_PENDING_KB = 256  # ix_user_pages_terms' gin_pending_list_limit (migration 0011)


class MemorySummary(Base):
    __tablename__ = "memory_summaries"

    conversation_id: Mapped[str] = mapped_column(
        Text, ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    kind: Mapped[str] = mapped_column(Text, primary_key=True)
    period: Mapped[str] = mapped_column(Text, primary_key=True, server_default=sql_text("''"))
    status: Mapped[str] = mapped_column(Text, nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False, server_default=sql_text("''"))
    tokens: Mapped[int] = mapped_column(Integer, nullable=False, server_default=sql_text("0"))
    first_seq: Mapped[int] = mapped_column(Integer, nullable=False, server_default=sql_text("0"))
    last_seq: Mapped[int] = mapped_column(Integer, nullable=False, server_default=sql_text("-1"))
    message_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default=sql_text("0"))
    compressions: Mapped[int] = mapped_column(Integer, nullable=False, server_default=sql_text("0"))
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default=sql_text("0"))
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (
        CheckConstraint("kind IN ('conversation', 'day', 'month', 'profile')", name="kind"),
        CheckConstraint("status IN ('pending', 'done')", name="status"),
        Index("ix_memory_summaries_next_attempt_at", "next_attempt_at"),
    )


class MemoryTopics(Base):
    __tablename__ = "memory_topics"

    conversation_id: Mapped[str] = mapped_column(
        Text, ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[str] = mapped_column(Text, primary_key=True, server_default=sql_text("''"))
    topics: Mapped[list[str]] = mapped_column(ARRAY(Text), nullable=False, server_default=sql_text("'{}'::text[]"))
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (Index("ix_memory_topics_topics", "topics", postgresql_using="gin"),)


class MemoryProfileFact(Base):
    __tablename__ = "memory_profile_facts"

    conversation_id: Mapped[str] = mapped_column(
        Text, ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    digest: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    fact: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    end_user: Mapped[str | None] = mapped_column(Text)  # the conversation's end user (NULL: the conversation's own)

    __table_args__ = (
        Index("ix_memory_profile_facts_tenant_created_at", "tenant", "created_at"),
        Index("ix_memory_profile_facts_tenant_end_user_created_at", "tenant", "end_user", "created_at",
              postgresql_where=sql_text("end_user IS NOT NULL")),
    )


class UserPage(Base):
    """A page of an end user's conversation, for the search across their conversations (migration 0009): its text
    and its terms, each lexeme prefixed with the user's key (memci_proxy.recall.users.across.tagged_terms)."""

    __tablename__ = "user_pages"

    conversation_id: Mapped[str] = mapped_column(
        Text, ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(Text, nullable=False)
    end_user: Mapped[str] = mapped_column(Text, nullable=False)
    first_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    last_seq: Mapped[int] = mapped_column(Integer, nullable=False)
    seen_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    text: Mapped[str] = mapped_column(Text, nullable=False)
    terms: Mapped[Any] = mapped_column(TSVECTOR, nullable=False)
    counts: Mapped[Any] = mapped_column(JSONB, nullable=False)
    length: Mapped[int] = mapped_column(Integer, nullable=False)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (
        # a short pending list (migration 0011): every search reads it whole, and every user's pages go through it
        Index("ix_user_pages_terms", "terms", postgresql_using="gin",
              postgresql_with={"gin_pending_list_limit": USER_TERMS_PENDING_KB}),
        Index("ix_user_pages_tenant_end_user_seen_at", "tenant", "end_user", "seen_at"),
    )
