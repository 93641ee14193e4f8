"""Memory across one end user's conversations (pure: no I/O, no clock).

With a user id (proxy.turn.end_user), every page of the user's conversations is indexed in PostgreSQL (table
``user_pages``): its text, and its terms as lexemes prefixed with the user's key (``tagged_terms``), so that a GIN
lookup reads one user's postings only. A search there gives candidates (pages holding any of the query's terms);
this module ranks them (BM25 over the candidates: a term most of them hold weighs little), labels them
(``<conversation>/<page>``, readable through ``recall``) and renders them for a pushed round or a ``recall`` result.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.engine.contents import utc_date
from proxy.recall.bm25 import BM25Index
from proxy.recall.pagetext import excerpt
from proxy.recall.text import content_terms, tokenize
from proxy.store.ports import UserPageText

MAX_TERM_CHARS = 120  # longer terms are left out of the index (PostgreSQL's lexemes are bounded; nobody asks for them)
QUERY_TERMS = 24  # most terms of a query looked up
CANDIDATES = 40  # pages read from the store per search, ranked here
SHORT_ID = 9  # characters of a conversation id in a label ("c" + 8 hex digits)
_LABEL = re.compile(r"^([a-z][0-9a-f]{5,31})/(\d+(?:\.\d+)?)$")


Candidate = UserPageText  # a page of another conversation of the user, as the store gives it


def label_of(candidate: Candidate) -> str:
    return page_label(candidate.conversation_id, candidate.number)


def page_label(conversation_id: str, number: str) -> str:
    """How a page of another conversation is named to the model: ``<first 9 characters of its id>/<page>``."""
    return f"{conversation_id[:SHORT_ID]}/{number}"


def parse_label(label: str) -> tuple[str, str] | None:
    """(conversation id prefix, page number) of a label ``page_label`` made; None for any other label."""
    match = _LABEL.match(label.strip())
    return (match.group(1), match.group(2)) if match else None


def tagged(user_key: str, term: str) -> str:
    return f"{user_key}.{term}"


def tagged_terms(user_key: str, text: str) -> list[str]:
    """The page's distinct terms as the user's lexemes (``<key>.<term>``), in order of first appearance."""
    return [tagged(user_key, t) for t in dict.fromkeys(tokenize(text)) if len(t) <= MAX_TERM_CHARS]


def query_terms(query: str) -> list[str]:
    """The query's distinct search terms (those naming the kind of answer out), at most ``QUERY_TERMS``."""
    return [t for t in dict.fromkeys(content_terms(query)) if len(t) <= MAX_TERM_CHARS][:QUERY_TERMS]


def tsquery_text(user_key: str, terms: Sequence[str]) -> str:
    """A tsquery matching a page holding any of ``terms`` (its lexemes quoted: taken as they are)."""
    return " | ".join("'" + tagged(user_key, t).replace("\\", "\\\\").replace("'", "''") + "'" for t in terms)


def rank(query: str, candidates: Sequence[Candidate], k: int) -> tuple[list[tuple[Candidate, float]], BM25Index]:
    """The best ``k`` candidates for ``query`` that hold at least two of its terms (its only one, for a one-term
    query: a page sharing one common word with the message is not a hit), best first, by BM25 over the candidates
    themselves (a term most of them hold weighs little); and that index (its idf places each hit's excerpt)."""
    index = BM25Index()
    for i, candidate in enumerate(candidates):
        index.add_terms(i, tokenize(candidate.text))
    terms = query_terms(query)
    need = min(2, len(terms))
    hits = []
    for doc, score in index.search_weighted(dict.fromkeys(terms, 1.0), max(k, len(candidates)), min_score=1e-9):
        if sum(1 for t in terms if index.holds(doc, t)) >= need:
            hits.append((candidates[int(doc)], score))
            if len(hits) == k:
                break
    return hits, index


def render(query: str, hits: Sequence[tuple[Candidate, float]], index: BM25Index | None, chars: int) -> str:
    """The hits newest first, each an excerpt of about ``chars`` characters around the query's terms."""
    if not hits:
        return f"No page of the user's other conversations matches {query!r}."
    terms = [t for t in dict.fromkeys(tokenize(query)) if len(t) > 1]
    weights = {t: index.idf(t) for t in terms} if index is not None else None
    lines = [f"Pages of the user's earlier conversations matching {query!r} (newest first; recall a page by its "
             f"label, e.g. \"{label_of(hits[0][0])}\", to read it in full):"]
    for candidate, score in sorted(hits, key=lambda hit: -hit[0].seen_at):
        lines.append(f"[Page {label_of(candidate)}] {utc_date(candidate.seen_at)}, another conversation, score "
                     f"{score:.2f}: {excerpt(candidate.text, terms, chars, chars, weights)}")
    return "\n".join(lines)


def render_page(candidate: Candidate) -> str:
    """A page of another conversation read in full."""
    return f"[Page {label_of(candidate)}] {utc_date(candidate.seen_at)}, another conversation of the user\n{candidate.text}"
