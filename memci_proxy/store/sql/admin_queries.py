"""The admin API's reads and small edits over PostgreSQL (ports.ConversationAdmin)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from memci_proxy.store.ports import ConversationInfo, StoredEvent
from memci_proxy.store.sql.models import Conversation, Entry, Event, Page

conv = Conversation.__table__
entries_t = Entry.__table__
pages_t = Page.__table__
events_t = Event.__table__

_ENTRY_COUNT = (
    select(func.count()).select_from(entries_t).where(entries_t.c.conversation_id == conv.c.id).scalar_subquery()
)
_PAGE_COUNT = select(func.count()).select_from(pages_t).where(pages_t.c.conversation_id == conv.c.id).scalar_subquery()
_INFO_COLUMNS = [
    conv.c.id,
    conv.c.tenant,
    conv.c.session_key,
    conv.c.parent_id,
    conv.c.forked_at,
    conv.c.label,
    conv.c.state_version,
    conv.c.created_at,
    conv.c.updated_at,
    conv.c.last_active_at,
    _ENTRY_COUNT.label("entries"),
    _PAGE_COUNT.label("pages"),
]


def _info(row: Any) -> ConversationInfo:
    return ConversationInfo(**row._asdict())


class ConversationAdminQueries:
    """Mixed into SqlConversationRepository."""

    engine: AsyncEngine

    async def list_conversations(
        self, tenant: str, limit: int = 50, before: datetime | None = None
    ) -> list[ConversationInfo]:
        stmt = select(*_INFO_COLUMNS).where(conv.c.tenant == tenant)
        if before is not None:
            stmt = stmt.where(conv.c.last_active_at < before)
        stmt = stmt.order_by(conv.c.last_active_at.desc(), conv.c.id).limit(limit)
        async with self.engine.connect() as connection:
            return [_info(row) for row in (await connection.execute(stmt)).all()]

    async def get_conversation(self, tenant: str, conversation_id: str) -> ConversationInfo | None:
        stmt = select(*_INFO_COLUMNS).where(conv.c.tenant == tenant, conv.c.id == conversation_id)
        async with self.engine.connect() as connection:
            row = (await connection.execute(stmt)).first()
        return None if row is None else _info(row)

    async def set_label(self, tenant: str, conversation_id: str, label: str | None) -> bool:
        stmt = (
            update(conv)
            .where(conv.c.tenant == tenant, conv.c.id == conversation_id)
            .values(label=label, updated_at=func.now())
            .returning(conv.c.id)
        )
        async with self.engine.begin() as connection:
            return (await connection.execute(stmt)).first() is not None

    async def load_events(
        self, tenant: str, conversation_id: str | None = None, kinds: tuple[str, ...] = (), limit: int = 100
    ) -> list[StoredEvent]:
        stmt = select(events_t).where(events_t.c.tenant == tenant)
        if conversation_id is not None:
            stmt = stmt.where(events_t.c.conversation_id == conversation_id)
        if kinds:
            stmt = stmt.where(events_t.c.kind.in_(list(kinds)))
        stmt = stmt.order_by(events_t.c.id.desc()).limit(limit)
        async with self.engine.connect() as connection:
            rows = (await connection.execute(stmt)).all()
        return [
            StoredEvent(
                tenant=r.tenant,
                conversation_id=r.conversation_id,
                kind=r.kind,
                payload=r.payload,
                id=r.id,
                created_at=r.created_at,
            )
            for r in rows
        ]
