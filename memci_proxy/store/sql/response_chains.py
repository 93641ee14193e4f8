"""Responses' answer chains in PostgreSQL (migration 0008): one row per stored answer, walked back in one query.

A row has no conversation column: the answer's conversation is recorded by an event (kind ``response``, payload
``{"id": ...}``) written by the same statement, and erasing the conversation deletes the rows its events name
(``delete_conversation_chains``), so ``previous_response_id`` of a deleted conversation is not found any more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ARRAY, Text, bindparam, delete, func, literal, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from memci_proxy.store.sql.models import Event, ResponseChainRow
from memci_proxy.store.sql.pgtext import escape, escape_optional, unescape

chains_t = ResponseChainRow.__table__
events_t = Event.__table__
RESPONSE_EVENT = "response"  # the event that ties a stored answer to its conversation

# The chain ending at :id, newest first; every link must be the tenant's (another tenant's id ends the walk).
_CHAIN = text("""
WITH RECURSIVE chain(id, previous_id, messages, depth) AS (
    SELECT id, previous_id, messages, 0 FROM response_chains WHERE id = :id AND tenant = :tenant
    UNION ALL
    SELECT r.id, r.previous_id, r.messages, c.depth + 1
    FROM response_chains r JOIN chain c ON r.id = c.previous_id
    WHERE r.tenant = :tenant AND c.depth < :max_depth
)
SELECT id, messages FROM chain ORDER BY depth DESC
""")
MAX_DEPTH = 100_000


class SqlResponseChains:
    def __init__(self, engine: AsyncEngine, write_engine: AsyncEngine | None = None) -> None:
        self.engine = engine
        self.write_engine = write_engine or engine  # the store's write connections (no ping before use)

    async def put_response(self, tenant: str, response_id: str, previous_id: str | None,
                           messages: list[dict[str, Any]], conversation_id: str | None = None) -> None:
        """One statement in autocommit: one round trip, committed (and flushed) when it returns. With the
        answer's conversation, its ``response`` event is written by the same statement."""
        stmt = insert(chains_t).values(id=escape(response_id), tenant=tenant,
                                       previous_id=escape_optional(previous_id), messages=messages)
        stmt = stmt.on_conflict_do_nothing(index_elements=[chains_t.c.id])
        if conversation_id is not None:
            kept = stmt.returning(chains_t.c.id).cte("kept")
            stmt = insert(events_t).from_select(
                ["tenant", "conversation_id", "kind", "payload"],
                select(literal(tenant), literal(conversation_id), literal(RESPONSE_EVENT),
                       func.jsonb_build_object("id", kept.c.id)),
            ).add_cte(kept)
        async with self.write_engine.connect() as connection:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.execute(stmt)

    async def load_links(self, tenant: str, response_id: str) -> list[tuple[str, list[dict[str, Any]]]] | None:
        """The chain ending at ``response_id`` as (id, the messages it added), oldest first; None when none."""
        async with self.engine.connect() as connection:
            rows = (await connection.execute(_CHAIN, {"id": escape(response_id), "tenant": tenant,
                                                      "max_depth": MAX_DEPTH})).all()
        return [(unescape(row_id), messages) for row_id, messages in rows] or None

    async def load_chain(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        links = await self.load_links(tenant, response_id)
        return None if links is None else [message for _, messages in links for message in messages]

    async def all_present(self, tenant: str, response_ids: Sequence[str]) -> bool:
        """Whether every one of the tenant's answers named is still stored (none erased since it was cached)."""
        wanted = sorted({escape(i) for i in response_ids})
        stmt = select(func.count()).select_from(chains_t).where(
            chains_t.c.tenant == tenant, chains_t.c.id == func.any(bindparam("ids", wanted, type_=ARRAY(Text))))
        async with self.engine.connect() as connection:
            return (await connection.execute(stmt)).scalar() == len(wanted)


async def delete_conversation_chains(connection: AsyncConnection, tenant: str, conversation_id: str) -> list[str]:
    """In the erasing transaction (before the conversation's events go): the stored answers of the conversation;
    returns their ids."""
    named = select(events_t.c.payload["id"].astext).where(
        events_t.c.tenant == tenant, events_t.c.conversation_id == conversation_id,
        events_t.c.kind == RESPONSE_EVENT)
    result = await connection.execute(
        delete(chains_t).where(chains_t.c.tenant == tenant, chains_t.c.id.in_(named)).returning(chains_t.c.id))
    return sorted(unescape(r.id) for r in result.all())
