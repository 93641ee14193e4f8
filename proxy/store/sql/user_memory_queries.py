"""The end user's memory across conversations (table user_pages, migration 0009), and a person's rights: their
conversations listed, exported, deleted.

Each page of a conversation with an end user is written with its text and its terms as lexemes prefixed with the
user's key (proxy.recall.across.tagged_terms): the GIN index on ``terms`` then finds one user's pages holding a
term without reading anyone else's postings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text as sql
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store.ports import UserPageRow, UserPageStats, UserPageText
from proxy.store.sql.pgtext import dumps, escape, unescape

_PUT = sql(
    "INSERT INTO user_pages (conversation_id, number, tenant, end_user, first_seq, last_seq, seen_at, text, terms, "
    "counts, length) "
    "SELECT :cid, :number, :tenant, :end_user, :first_seq, :last_seq, :seen_at, :text, "
    "array_to_tsvector(CAST(:terms AS text[])), CAST(:counts AS jsonb), :length "
    "WHERE EXISTS (SELECT 1 FROM conversations WHERE id = :cid AND tenant = :tenant AND end_user = :end_user) "
    "ON CONFLICT (conversation_id, number) DO UPDATE SET first_seq = excluded.first_seq, "
    "last_seq = excluded.last_seq, text = excluded.text, terms = excluded.terms, counts = excluded.counts, "
    "length = excluded.length, updated_at = now() "
    "WHERE user_pages.text IS DISTINCT FROM excluded.text"
)
# The candidates' lengths and the counts of the query's terms only: ranking reads no text.
_CANDIDATES = sql(
    "SELECT conversation_id, number, seen_at, length, "
    "(SELECT jsonb_object_agg(k, counts -> k) FROM unnest(CAST(:counted AS text[])) AS k WHERE counts ? k) AS tf "
    "FROM user_pages "
    "WHERE terms @@ CAST(:query AS tsquery) AND tenant = :tenant AND end_user = :end_user AND conversation_id <> :cid "
    "ORDER BY ts_rank(terms, CAST(:query AS tsquery)) DESC, seen_at DESC LIMIT :limit"
)
_COUNT = sql("SELECT count(*) FROM user_pages WHERE tenant = :tenant AND end_user = :end_user")
_TEXTS = sql(
    "SELECT conversation_id, number, seen_at, text FROM user_pages "
    "WHERE tenant = :tenant AND end_user = :end_user AND (conversation_id, number) IN "
    "(SELECT * FROM unnest(CAST(:cids AS text[]), CAST(:numbers AS text[])))"
)
_PAGE = sql(
    "SELECT p.conversation_id, p.number, p.seen_at, p.text FROM user_pages p "
    "WHERE p.tenant = :tenant AND p.end_user = :end_user AND p.number = :number "
    "AND p.conversation_id LIKE :prefix ORDER BY p.seen_at DESC LIMIT 1"
)
_CONVERSATIONS = sql(
    "SELECT c.id, c.created_at, c.last_active_at, c.label, "
    "(SELECT count(*) FROM entries e WHERE e.conversation_id = c.id) AS messages "
    "FROM conversations c WHERE c.tenant = :tenant AND c.end_user = :end_user "
    "ORDER BY c.last_active_at DESC, c.id LIMIT :limit"
)
_DELETE = sql("DELETE FROM conversations WHERE tenant = :tenant AND end_user = :end_user RETURNING id")


def _page(row: Any) -> UserPageText:
    return UserPageText(row.conversation_id, row.number, row.seen_at.timestamp(), unescape(row.text))


class UserMemoryQueries:
    """Mixed into SqlConversationRepository."""

    engine: AsyncEngine
    write_engine: AsyncEngine

    async def put_user_pages(self, tenant: str, end_user: str, conversation_id: str,
                             pages: Sequence[UserPageRow]) -> None:
        """The pages as they are now (new, or grown since); none of a conversation that is not this user's."""
        if not pages or not end_user:
            return
        rows = [{"cid": conversation_id, "number": p.number, "tenant": tenant, "end_user": end_user,
                 "first_seq": p.first_seq, "last_seq": p.last_seq,
                 "seen_at": dt.datetime.fromtimestamp(p.seen_at, dt.timezone.utc), "text": escape(p.text),
                 "terms": [escape(t) for t in p.terms], "counts": dumps(p.counts), "length": p.length}
                for p in pages]
        async with self.write_engine.begin() as connection:
            await connection.execute(_PUT, rows)

    async def user_page_candidates(self, tenant: str, end_user: str, conversation_id: str, tsquery: str,
                                   counted: Sequence[str], limit: int) -> list[UserPageStats]:
        """Pages of the user's other conversations holding any term of ``tsquery``, the most matching first, with
        their lengths and the counts of the ``counted`` terms in them."""
        if not end_user or not tsquery:
            return []
        params = {"tenant": tenant, "end_user": end_user, "cid": conversation_id, "query": tsquery,
                  "counted": [escape(t) for t in counted], "limit": limit}
        async with self.engine.connect() as connection:
            rows = (await connection.execute(_CANDIDATES, params)).all()
        return [UserPageStats(r.conversation_id, r.number, r.seen_at.timestamp(), r.length,
                              {k: int(v) for k, v in (r.tf or {}).items()}) for r in rows]  # (JSON: unescaped)

    async def user_page_count(self, tenant: str, end_user: str) -> int:
        """How many pages the user has (an index-only count over the user's rows)."""
        async with self.engine.connect() as connection:
            return int((await connection.execute(_COUNT, {"tenant": tenant, "end_user": end_user})).scalar() or 0)

    async def user_page_texts(self, tenant: str, end_user: str, pages: Sequence[tuple[str, str]]
                              ) -> list[UserPageText]:
        """The texts of the user's pages named by (conversation id, page number)."""
        if not end_user or not pages:
            return []
        params = {"tenant": tenant, "end_user": end_user, "cids": [c for c, _ in pages],
                  "numbers": [n for _, n in pages]}
        async with self.engine.connect() as connection:
            return [_page(r) for r in (await connection.execute(_TEXTS, params)).all()]

    async def user_page(self, tenant: str, end_user: str, id_prefix: str, number: str) -> UserPageText | None:
        """A page of one of the user's conversations, by its label's parts (proxy.recall.across.parse_label)."""
        if not end_user:
            return None
        prefix = id_prefix.replace("\\", "").replace("%", "").replace("_", "") + "%"
        params = {"tenant": tenant, "end_user": end_user, "number": number, "prefix": prefix}
        async with self.engine.connect() as connection:
            row = (await connection.execute(_PAGE, params)).first()
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
