"""Responses' answer chains in PostgreSQL (migration 0008): one row per stored answer, walked back in one query."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store.sql.models import ResponseChainRow
from proxy.store.sql.pgtext import escape, escape_optional

chains_t = ResponseChainRow.__table__

# The chain ending at :id, newest first; every link must be the tenant's (another tenant's id ends the walk).
_CHAIN = text("""
WITH RECURSIVE chain(id, previous_id, messages, depth) AS (
    SELECT id, previous_id, messages, 0 FROM response_chains WHERE id = :id AND tenant = :tenant
    UNION ALL
    SELECT r.id, r.previous_id, r.messages, c.depth + 1
    FROM response_chains r JOIN chain c ON r.id = c.previous_id
    WHERE r.tenant = :tenant AND c.depth < :max_depth
)
SELECT messages FROM chain ORDER BY depth DESC
""")
MAX_DEPTH = 100_000


class SqlResponseChains:
    def __init__(self, engine: AsyncEngine, write_engine: AsyncEngine | None = None) -> None:
        self.engine = engine
        self.write_engine = write_engine or engine  # the store's write connections (no ping before use)

    async def put_response(self, tenant: str, response_id: str, previous_id: str | None,
                           messages: list[dict[str, Any]]) -> None:
        """One statement in autocommit: one round trip, committed (and flushed) when it returns."""
        stmt = insert(chains_t).values(id=escape(response_id), tenant=tenant,
                                       previous_id=escape_optional(previous_id), messages=messages)
        async with self.write_engine.connect() as connection:
            connection = await connection.execution_options(isolation_level="AUTOCOMMIT")
            await connection.execute(stmt.on_conflict_do_nothing(index_elements=[chains_t.c.id]))

    async def load_chain(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        async with self.engine.connect() as connection:
            rows = (await connection.execute(_CHAIN, {"id": escape(response_id), "tenant": tenant,
                                                      "max_depth": MAX_DEPTH})).all()
        if not rows:
            return None
        return [message for (messages,) in rows for message in messages]
