"""The end user's memory across conversations (table user_pages, migration 0009), and a person's rights: their
conversations listed, exported, deleted.

Each page of a conversation with an end user is written with its text and its terms as lexemes prefixed with the
user's key (memci_proxy.recall.users.across.tagged_terms): the GIN index on ``terms`` then finds one user's pages
holding a term without reading anyone else's postings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy import text as sql
from sqlalchemy.ext.asyncio import AsyncEngine

from memci_proxy.store.ports import UserPageRow, UserPageStats, UserPageText
from memci_proxy.store.sql.pgtext import dumps, escape, loads, unescape

# The statements of the request path and of the write behind the answer run on the driver's own connection (asyncpg:
# prepared once per connection, no ping before use, one round trip each).
_PUT = (
    "INSERT INTO user_pages (conversation_id, number, tenant, end_user, first_seq, last_seq, seen_at, text, terms, "
    "counts, length) "
    "SELECT $1, $2, $3, $4, $5, $6, $7, $8, array_to_tsvector($9::text[]), $10::text::jsonb, $11 "
    "WHERE EXISTS (SELECT 1 FROM conversations WHERE id = $1 AND tenant = $3 AND end_user = $4) "
    "ON CONFLICT (conversation_id, number) DO UPDATE SET first_seq = excluded.first_seq, "
    "last_seq = excluded.last_seq, text = excluded.text, terms = excluded.terms, counts = excluded.counts, "
    "length = excluded.length, updated_at = now() "
    "WHERE user_pages.text IS DISTINCT FROM excluded.text"
)
# The candidates' lengths and the counts of the query's terms only: ranking reads no text.
_CANDIDATES = (
    "SELECT conversation_id, number, seen_at, length, "
    "(SELECT jsonb_object_agg(k, counts -> k) FROM unnest($6::text[]) AS k WHERE counts ? k)::text AS tf "
    "FROM user_pages "
    "WHERE terms @@ $4::tsquery AND tenant = $1 AND end_user = $2 AND conversation_id <> $3 "
    "ORDER BY ts_rank(terms, $4::tsquery) DESC, seen_at DESC LIMIT $5"
)
_COUNTS = "SELECT conversation_id, count(*) AS pages FROM user_pages WHERE tenant = $1 AND end_user = $2 GROUP BY 1"
_TEXTS = (
    "SELECT conversation_id, number, seen_at, text FROM user_pages "
    "WHERE tenant = $1 AND end_user = $2 AND (conversation_id, number) IN "
    "(SELECT * FROM unnest($3::text[], $4::text[]))"
)
_PAGE = (
    "SELECT conversation_id, number, seen_at, text FROM user_pages "
    "WHERE tenant = $1 AND end_user = $2 AND number = $3 AND conversation_id LIKE $4 ORDER BY seen_at DESC LIMIT 1"
)
_CONVERSATIONS = sql(
    "SELECT c.id, c.created_at, c.last_active_at, c.label, "
    "(SELECT count(*) FROM entries e WHERE e.conversation_id = c.id) AS messages "
    "FROM conversations c WHERE c.tenant = :tenant AND c.end_user = :end_user "
    "ORDER BY c.last_active_at DESC, c.id LIMIT :limit"
)
_DELETE = sql("DELETE FROM conversations WHERE tenant = :tenant AND end_user = :end_user RETURNING id")


def _page(record: Any) -> UserPageText:
    """A page's text from a driver's record."""
    return UserPageText(record["conversation_id"], record["number"], record["seen_at"].timestamp(),
                        unescape(record["text"]))


class UserMemoryQueries:
    """Mixed into SqlConversationRepository."""

    engine: AsyncEngine
    write_engine: AsyncEngine
    _on_driver: Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]  # SqlConversationRepository's

    async def put_user_pages(self, pages: Sequence[tuple[str, str, str, UserPageRow]]) -> None:
        """(tenant, end user, conversation id, page) as they are now (new, or grown since), in one batch; none of
        a conversation that is not that user's."""
        rows = [(conversation_id, p.number, tenant, end_user, p.first_seq, p.last_seq,
                 dt.datetime.fromtimestamp(p.seen_at, dt.timezone.utc), escape(p.text), [escape(t) for t in p.terms],
                 dumps(p.counts), p.length) for tenant, end_user, conversation_id, p in pages if end_user]
        if not rows:
            return
        await self._on_driver(lambda raw: raw.executemany(_PUT, rows))

    async def user_page_candidates(self, tenant: str, end_user: str, conversation_id: str, tsquery: str,
                                   counted: Sequence[str], limit: int) -> list[UserPageStats]:
        """Pages of the user's other conversations holding any term of ``tsquery``, the most matching first, with
        their lengths and the counts of the ``counted`` terms in them."""
        if not end_user or not tsquery:
            return []
        rows = await self._on_driver(lambda raw: raw.fetch(
            _CANDIDATES, tenant, end_user, conversation_id, tsquery, limit, [escape(t) for t in counted]))
        return [UserPageStats(r["conversation_id"], r["number"], r["seen_at"].timestamp(), r["length"],
                              {k: int(v) for k, v in (loads(r["tf"]) if r["tf"] else {}).items()}) for r in rows]

    async def user_page_counts(self, tenant: str, end_user: str) -> dict[str, int]:
        """How many pages the user has in each of their conversations that has any."""
        rows = await self._on_driver(lambda raw: raw.fetch(_COUNTS, tenant, end_user))
        return {r["conversation_id"]: int(r["pages"]) for r in rows}

    async def user_page_texts(self, tenant: str, end_user: str, pages: Sequence[tuple[str, str]]
                              ) -> list[UserPageText]:
        """The texts of the user's pages named by (conversation id, page number)."""
        if not end_user or not pages:
            return []
        rows = await self._on_driver(lambda raw: raw.fetch(
            _TEXTS, tenant, end_user, [c for c, _ in pages], [n for _, n in pages]))
        return [_page(r) for r in rows]

    async def user_page(self, tenant: str, end_user: str, id_prefix: str, number: str) -> UserPageText | None:
        """A page of one of the user's conversations, by its label's parts
        (memci_proxy.recall.users.across.parse_label)."""
        if not end_user:
            return None
        prefix = id_prefix.replace("\\", "").replace("%", "").replace("_", "") + "%"
        row = await self._on_driver(lambda raw: raw.fetchrow(_PAGE, tenant, end_user, number, prefix))
        return None if row is None else _page(row)

    async def user_conversations(self, tenant: str, end_user: str, limit: int = 1000) -> list[dict[str, Any]]:
        """The user's conversations, the most recently active first."""
        params = {"tenant": tenant, "end_user": end_user, "limit": limit}
        async with self.engine.connect() as connection:
            rows = (await connection.execute(_CONVERSATIONS, params)).all()
        return [{"id": r.id, "created_at": r.created_at.isoformat(), "last_active_at": r.last_active_at.isoformat(),
                 "label": r.label, "messages": int(r.messages)} for r in rows]

    async def delete_user(self, tenant: str, end_user: str) -> list[str]:
        """Every conversation of the user, with all that hangs on them (entries, pages, vectors, summaries, profile
        facts, the user's page index: foreign keys ON DELETE CASCADE); the ids deleted."""
        async with self.write_engine.begin() as connection:
            deleted = [r.id for r in (await connection.execute(_DELETE, {"tenant": tenant, "end_user": end_user}))]
            await connection.execute(sql("DELETE FROM memory_profile_facts WHERE tenant = :tenant AND end_user = :u"),
                                     {"tenant": tenant, "u": end_user})
        return deleted
