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
from typing import Any

from proxy.engine.contents import utc_date
from proxy.recall.bm25 import BM25Index
from proxy.recall.counting import counted_terms
from proxy.recall.pagetext import USER_PLACE_WEIGHT, excerpt
from proxy.recall.ranking import query_weights
from proxy.recall.text import content_terms, tokenize
from proxy.store.ports import UserPageText

MAX_TERM_CHARS = 120  # longer terms are left out of the index (PostgreSQL's lexemes are bounded; nobody asks for them)
QUERY_TERMS = 24  # most terms of a query looked up
CANDIDATES = 80  # pages read from the store per search, ranked here
USER_WEIGHT = 2  # as recall_user_weight's default: the user's own words count twice in a page's terms
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


_SHOWN = re.compile(r"\[Page ([a-z][0-9a-f]{5,31}/\d+(?:\.\d+)?)\]")


def shown_labels(state: Any) -> set[str]:
    """The labels of other conversations' pages that the conversation's kept recall rounds show (their hidden
    messages, still in the prompt)."""
    if state is None:
        return set()
    return {label for group in state.hidden for m in group.messages if m.get("role") == "tool"
            for label in _SHOWN.findall(m.get("content") if isinstance(m.get("content"), str) else "")}


_ROLE_LINE = re.compile(r"^(user|assistant|tool|system|developer|function): ", re.M)


def tagged(user_key: str, term: str) -> str:
    return f"{user_key}.{term}"


def tagged_terms(user_key: str, text: str) -> list[str]:
    """The page's distinct terms as the user's lexemes (``<key>.<term>``), in order of first appearance."""
    words = tokenize(_ROLE_LINE.sub("", text))  # the role labels are not what the page says
    return [tagged(user_key, t) for t in dict.fromkeys(words) if len(t) <= MAX_TERM_CHARS]


def query_terms(query: str) -> list[str]:
    """The query's distinct search terms (those naming the kind of answer out), at most ``QUERY_TERMS``."""
    return [t for t in dict.fromkeys(content_terms(query)) if len(t) <= MAX_TERM_CHARS][:QUERY_TERMS]


def tsquery_text(user_key: str, terms: Sequence[str]) -> str:
    """A tsquery matching a page holding any of ``terms`` (its lexemes quoted: taken as they are)."""
    return " | ".join("'" + tagged(user_key, t).replace("\\", "\\\\").replace("'", "''") + "'" for t in terms)




def page_terms(text: str, user_weight: int = USER_WEIGHT) -> list[str]:
    """A page's BM25 terms from its role-labelled text: the user's own words count ``user_weight`` times (what a
    user asks back about is mostly what they said; an assistant's long answers weigh less), with the terms of
    what their numbers count (proxy.recall.counting)."""
    terms: list[str] = []
    marks = list(_ROLE_LINE.finditer(text))
    starts = [(m.end(), m.group(1)) for m in marks] or [(0, "user")]
    ends = [m.start() for m in marks[1:]] + [len(text)]
    for (start, role), end in zip(starts, ends):
        words = tokenize(text[start:end])
        if role == "user":
            terms.extend(words * user_weight)
            terms.extend(counted_terms(text[start:end]))
        else:
            terms.extend(words)
    return terms


def rank(query: str, candidates: Sequence[Candidate], k: int, counting: bool = False
         ) -> tuple[list[tuple[Candidate, float]], BM25Index]:
    """The best ``k`` candidates for ``query`` that hold at least two of its terms (its only one, for a one-term
    query: a page sharing one common word with the message is not a hit), best first, by BM25 over the candidates
    themselves (a term most of them hold weighs little); and that index (its idf places each hit's excerpt)."""
    index = BM25Index()
    for i, candidate in enumerate(candidates):
        index.add_terms(i, page_terms(candidate.text))
    weights = query_weights(query, counting=counting)  # the times a query names weigh less (they say when)
    terms = [t for t in query_terms(query) if weights.get(t, 1.0) >= 1.0] or query_terms(query)
    need = min(2, len(terms))
    hits = []
    for doc, score in index.search_weighted(weights, max(k, len(candidates)), min_score=1e-9):
        held = {t for t in terms if index.holds(doc, t)}
        if len(held) >= need:
            hits.append((candidates[int(doc)], score))
            if len(hits) == k:
                break
    return hits, index


def render(query: str, hits: Sequence[tuple[Candidate, float]], index: BM25Index | None, chars: int,
           reply_first: bool = False) -> str:
    """The hits newest first, each an excerpt of about ``chars`` characters around the query's terms (the best
    hit's twice that; a message up to twice its window shown whole). ``reply_first``: the excerpts placed in the
    assistant's words before the user's where the terms meet in both (a question about what the assistant said)."""
    if not hits:
        return f"No page of the user's other conversations matches {query!r}."
    terms = [t for t in dict.fromkeys(tokenize(query)) if len(t) > 1]
    weights = {t: index.idf(t) for t in terms} if index is not None else None
    lines = [f"Pages of the user's earlier conversations matching {query!r} (newest first; recall a page by its "
             f"label, e.g. \"{label_of(hits[0][0])}\", to read it in full):"]
    best = hits[0][0]
    place = 1 / USER_PLACE_WEIGHT if reply_first else USER_PLACE_WEIGHT
    for candidate, score in sorted(hits, key=lambda hit: -hit[0].seen_at):
        size = 2 * chars if candidate is best else chars  # the best hit's window twice as wide
        lines.append(f"[Page {label_of(candidate)}] {utc_date(candidate.seen_at)}, another conversation, score "
                     f"{score:.2f}: {excerpt(candidate.text, terms, size, 2 * size, weights, user_place=place)}")
    return "\n".join(lines)


def render_page(candidate: Candidate) -> str:
    """A page of another conversation read in full."""
    return f"[Page {label_of(candidate)}] {utc_date(candidate.seen_at)}, another conversation of the user\n{candidate.text}"
