"""Full-text search over a conversation's archived and evicted pages (pages.tsv: summary weight A, message text
weight B; NULL while a page is active, migration 0007)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Text, cast, func, literal, literal_column, select
from sqlalchemy.ext.asyncio import AsyncEngine

from memci_proxy.store.ports import PageRow
from memci_proxy.store.sql import pgtext
from memci_proxy.store.sql.models import TSV_CONFIG, Conversation, Page

conv = Conversation.__table__
pages_t = Page.__table__


def page_row(row: Any) -> PageRow:
    """A stored page as the store's callers see it (its summary unescaped)."""
    return PageRow(
        number=row.number,
        first_seq=row.first_seq,
        last_seq=row.last_seq,
        state=row.state,
        tokens=row.tokens,
        summary=pgtext.unescape(row.summary),
        recall_count=row.recall_count,
        last_recalled_turn=row.last_recalled_turn,
    )


class PageSearchQueries:
    """Mixed into SqlConversationRepository."""

    engine: AsyncEngine

    async def search_pages(
        self,
        tenant: str,
        conversation_id: str,
        query: str,
        limit: int = 5,
        states: tuple[str, ...] = ("archived", "evicted"),
    ) -> list[tuple[PageRow, float]]:
        """Pages matching ``query`` (web-search syntax: words, "phrases", -exclusions, OR), best
        first, with their rank (ts_rank_cd, normalised by length). Lexical: no stemming
        (configuration "simple"), so it works the same for every language. Active pages are not indexed
        (their tsv stays NULL: they are in the prompt), so ``states`` including 'active' finds no active page;
        a page becomes searchable when it is archived or evicted."""
        tsquery = func.websearch_to_tsquery(literal_column(f"'{TSV_CONFIG}'::regconfig"), cast(literal(pgtext.escape(query)), Text))
        rank = func.ts_rank_cd(pages_t.c.tsv, tsquery, 1).label("rank")
        stmt = (
            select(pages_t, rank)
            .where(
                pages_t.c.conversation_id == conversation_id,
                pages_t.c.state.in_(list(states)),
                pages_t.c.tsv.op("@@")(tsquery),
                select(conv.c.id).where(conv.c.id == conversation_id, conv.c.tenant == tenant).exists(),
            )
            .order_by(rank.desc(), pages_t.c.first_seq)
            .limit(limit)
        )
        async with self.engine.connect() as connection:
            rows = (await connection.execute(stmt)).all()
        return [(page_row(r), float(r.rank)) for r in rows]
