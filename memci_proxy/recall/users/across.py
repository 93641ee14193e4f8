"""Memory across one end user's conversations (pure: no I/O, no clock).

With a user id (memci_proxy.turn.end_user), every page of the user's conversations is indexed in PostgreSQL (table
``user_pages``): its text, and its terms as lexemes prefixed with the user's key (``tagged_terms``), so that a GIN
lookup reads one user's postings only. A search there gives candidates (pages holding any of the query's terms);
this module ranks them (BM25 over the candidates: a term most of them hold weighs little), labels them
(``<conversation>/<page>``, readable through ``recall``) and renders them for a pushed round or a ``recall`` result.
"""

from __future__ import annotations

import re
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memci_proxy.engine.contents import utc_date
from memci_proxy.recall.lexical.bm25 import DEFAULT_B as B
from memci_proxy.recall.lexical.bm25 import DEFAULT_K1 as K1
from memci_proxy.recall.lexical.counting import counted_terms
from memci_proxy.recall.reading.pagetext import USER_PLACE_WEIGHT, excerpt
from memci_proxy.recall.search.ranking import query_weights
from memci_proxy.recall.push.salience import MAX_DF, MIN_DF, PAGE_SHARE, SHORT_NUMBER_DIGITS
from memci_proxy.recall.lexical.text import content_terms, tokenize
from memci_proxy.store.ports import UserPageStats, UserPageText

MAX_TERM_CHARS = 120  # longer terms are left out of the index (PostgreSQL's lexemes are bounded; nobody asks for them)
QUERY_TERMS = 24  # most terms of a query looked up
CANDIDATES = 80  # pages read from the store per search, ranked here
USER_WEIGHT = 2  # as recall_user_weight's default: the user's own words count twice in a page's terms
SHORT_ID = 9  # characters of a conversation id in a label ("c" + 8 hex digits)
_LABEL = re.compile(r"^([a-z][0-9a-f]{5,31})/(\d+(?:\.\d+)?)$")


Candidate = UserPageText  # a page of another conversation of the user, as the store gives it
Stats = UserPageStats  # a candidate's length and the counts of the query's terms in it


def label_of(candidate: Candidate | UserPageStats) -> str:
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


def tagged_terms(user_key: str, terms: Iterable[str]) -> list[str]:
    """The page's distinct terms (``page_counts``' keys: its words without the role labels, and the counted
    forms) as the user's lexemes (``<key>.<term>``), in order of first appearance."""
    return [tagged(user_key, t) for t in dict.fromkeys(terms) if len(t) <= MAX_TERM_CHARS]


def query_terms(query: str) -> list[str]:
    """The query's distinct search terms (those naming the kind of answer out), at most ``QUERY_TERMS``."""
    return [t for t in dict.fromkeys(content_terms(query)) if len(t) <= MAX_TERM_CHARS][:QUERY_TERMS]


def tsquery_text(user_key: str, terms: Sequence[str]) -> str:
    """A tsquery matching a page holding any of ``terms`` (its lexemes quoted: taken as they are)."""
    return " | ".join("'" + tagged(user_key, t).replace("\\", "\\\\").replace("'", "''") + "'" for t in terms)


def _segments(text: str) -> list[tuple[str, str]]:
    """(role, what it said) of a role-labelled page text, in order; an unlabelled text is the user's."""
    marks = list(_ROLE_LINE.finditer(text))
    starts = [(m.end(), m.group(1)) for m in marks] or [(0, "user")]
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [(role, text[start:end]) for (start, role), end in zip(starts, ends)]


def page_counts(text: str, user_weight: int = USER_WEIGHT) -> tuple[dict[str, int], int]:
    """A page's BM25 term counts from its role-labelled text, and their sum, as stored beside it; the terms in order
    of first appearance. The user's own words count ``user_weight`` times (what a user asks back about is mostly what
    they said; an assistant's long answers weigh less), with the terms of what their numbers count
    (memci_proxy.recall.lexical.counting)."""
    counts: Counter[str] = Counter()
    for role, said in _segments(text):
        words = tokenize(said)
        if role == "user":
            for term, n in Counter(words).items():
                counts[term] += n * user_weight
            counts.update(counted_terms(said))
        else:
            counts.update(words)
    return dict(counts), sum(counts.values())


@dataclass(frozen=True, slots=True)
class Query:
    """A search of a user's pages: the terms a page must hold (``terms``: two of them, or the only one) and the
    BM25 weights (``weights``: the times a question names weigh less, counted forms for a count)."""

    text: str
    terms: list[str]
    weights: dict[str, float]


def query_of(text: str, counting: bool = False) -> Query:
    weights = query_weights(text, counting=counting)
    terms = [t for t in query_terms(text) if weights.get(t, 1.0) >= 1.0] or query_terms(text)
    return Query(text, terms, weights)


def is_short_number(term: str) -> bool:
    """A number of a few digits: never specific by itself (memci_proxy.recall.push.salience.SHORT_NUMBER_DIGITS)."""
    return term.isdigit() and len(term) <= SHORT_NUMBER_DIGITS


def specific_limit(user_pages: int) -> int:
    """The most pages of the user a term may be held by and still name something specific
    (memci_proxy.recall.push.salience's bounds: a tenth of the pages, at least MIN_DF, at most MAX_DF)."""
    return int(min(MAX_DF, max(MIN_DF, PAGE_SHARE * user_pages)))


def held_by(query: Query, candidates: Sequence[Stats]) -> dict[str, int]:
    """How many of the candidates hold each of the query's terms (its weighed ones and those a hit must hold)."""
    return {t: sum(1 for c in candidates if c.counts.get(t)) for t in dict.fromkeys([*query.weights, *query.terms])}


def rank(query: Query, candidates: Sequence[Stats], k: int, specific: int | None = None
         ) -> tuple[list[tuple[Stats, float]], dict[str, float]]:
    """The best ``k`` candidates holding at least two of the query's terms (its only one, for a one-term query: a
    page sharing one common word with the message is not a hit), best first, by BM25 over the candidates themselves
    (a term most of them hold weighs little; memci_proxy.recall.lexical.bm25's formula); and the terms' idf (placing
    excerpts). ``specific``: a hit must also hold a term at most that many candidates hold, not a short number (a
    push's: the template words of a user's every chat, "item", "brief", match every page and name nothing)."""
    n = len(candidates)
    if not n:
        return [], {}
    df = held_by(query, candidates)
    average = sum(c.length for c in candidates) / n or 1.0
    idf = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in query.weights}
    need = min(2, len(query.terms))
    rare = {t for t in query.terms if specific is None or 0 < df[t] <= specific and not is_short_number(t)}
    scored = []
    for position, c in enumerate(candidates):
        if sum(1 for t in query.terms if c.counts.get(t)) < need or not any(c.counts.get(t) for t in rare):
            continue
        norm = K1 * (1 - B + B * c.length / average)
        score = sum(w * idf[t] * tf * (K1 + 1) / (tf + norm)
                    for t, w in query.weights.items() if w > 0 and (tf := c.counts.get(t, 0)))
        scored.append((-score, position, c))
    scored.sort(key=lambda s: (s[0], s[1]))
    return [(c, -negative) for negative, _, c in scored[:k]], idf


def render(query: str, hits: Sequence[tuple[Candidate, float]], idf: Mapping[str, float] | None, chars: int,
           reply_first: bool = False) -> str:
    """The hits newest first, each an excerpt of about ``chars`` characters around the query's terms (the best
    hit's twice that; a message up to twice its window shown whole). ``reply_first``: the excerpts placed in the
    assistant's words before the user's where the terms meet in both (a question about what the assistant said)."""
    if not hits:
        return f"No page of the user's other conversations matches {query!r}."
    terms = [t for t in dict.fromkeys(tokenize(query)) if len(t) > 1]
    weights = {t: idf.get(t, 0.0) for t in terms} if idf else None
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
    return (f"[Page {label_of(candidate)}] {utc_date(candidate.seen_at)}, another conversation of the user\n"
            f"{candidate.text}")
