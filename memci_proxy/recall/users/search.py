"""The search of an end user's other conversations (memci_proxy.recall.users.across ranks; the store finds and reads):
the candidates' statistics first, the texts of the hits alone after, so that no page is tokenized on the request
path."""

from __future__ import annotations

from collections.abc import Set
from typing import Any

from memci_proxy.recall.users.across import (CANDIDATES, Candidate, held_by, label_of, query_of, query_terms, rank,
                                             specific_limit, tsquery_text)


async def search_user(repo: Any, tenant: str, end_user: str, conversation_id: str, text: str, k: int,
                      counting: bool = False, exclude: Set[str] = frozenset(), user_pages: int | None = None,
                      common: set[str] | None = None) -> tuple[list[tuple[Candidate, float]], dict[str, float]]:
    """The best ``k`` pages for ``text`` among the user's conversations other than ``conversation_id``, best
    first, none whose label is in ``exclude``; with the query terms' idf among the candidates. ``user_pages``: how
    many pages the user has (a push's search: each hit must hold a term specific among them); ``common`` then
    receives the query's terms found too common among them to name anything (more candidates hold them than the
    bound: the user has at least that many pages holding them, for good). Nothing without a user, or from a store
    that keeps no user memory."""
    query = query_of(text, counting)
    finder = getattr(repo, "user_page_candidates", None)
    if not end_user or not query.terms or finder is None:
        return [], {}
    stats = await finder(tenant, end_user, conversation_id, tsquery_text(end_user, query_terms(text)),
                         list(query.weights), max(CANDIDATES, 2 * k))
    specific = specific_limit(user_pages) if user_pages is not None else None
    if specific is not None and common is not None:  # among all the candidates: the shown ones hold them too
        common.update(t for t, df in held_by(query, stats).items() if t in query.terms and df > specific)
    hits, idf = rank(query, [s for s in stats if label_of(s) not in exclude], k, specific)
    if not hits:
        return [], idf
    pages = await repo.user_page_texts(tenant, end_user, [(s.conversation_id, s.number) for s, _ in hits])
    texts = {(p.conversation_id, p.number): p for p in pages}
    return [(texts[key], score) for s, score in hits if (key := (s.conversation_id, s.number)) in texts], idf
