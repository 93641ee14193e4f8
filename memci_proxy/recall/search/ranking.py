"""The recall search's ranking, step by step (pure): what the resolver runs and what the evals measure.

1. ``query_weights``: the query's terms, its proper nouns, numbers and codes boosted
   (memci_proxy.recall.lexical.entities). The word a question puts after "how" (``how many``, ``how much``, ``how
   long``, ``how often`` …) names the kind of answer wanted, not what it is about: it is left out (a page rarely repeats
   it, many pages hold it). The words of the times it names ("four weeks ago", "last Saturday", "in the past two
   months") say when, not what: they weigh ``TIME_WEIGHT`` (step 2 ranks by the days they name; in full they would find
   the pages that say "a few weeks ago" or "Saturday" of something else). A question that asks for a count or a total
   weighs the counted form of each of its terms as much as the term (memci_proxy.recall.lexical.counting): the pages
   where the user gave a count of what it counts ("I have 12 rare figurines") rank above the pages that only name it.
2. ``preferred_days``: the days the query names (memci_proxy.recall.dates.asked), then the days after them up to today:
   an event is told of on its day or later ("I cleaned my sneakers last month", said this week). The pages of the
   asked days climb a ranking first, those of the days after them next (memci_proxy.recall.dates.asked.prefer_days).
3. ``lexical_candidates``: BM25's best pages, and when the query names days, the best of the pages of those days
   and after (a page of the asked time that other pages outscore joins the candidates; the cost is that of the
   postings BM25 reads anyway).
4. The vector half (memci_proxy.recall.vectors.candidates) embeds the candidates' ``candidate_views`` in their order
   within one search's bound: first each candidate's user words (short: what a user asks back about, not blurred
   by a long answer), best lexical first, then each whole page (what the assistant said, too). A page's cosine
   is that of its best view (``best_views``).
5. ``fuse``: reciprocal-rank fusion of the two halves under the top lexical hits, the preferred days climbing
   (memci_proxy.recall.search.fusion.fuse_lexical_and_vector, memci_proxy.recall.dates.asked.prefer_days);
   ``lexical_ranking`` is the search without the vector half.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from memci_proxy.engine.memo import memoised
from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.lexical.counting import counted_form, counts
from memci_proxy.recall.dates.asked import DaySpan, asked_days, prefer_days, without_times
from memci_proxy.recall.lexical.entities import boosted_query
from memci_proxy.recall.search.fusion import fuse_lexical_and_vector
from memci_proxy.recall.lexical.text import content_terms, tokenize

__all__ = ["MIN_SCORE", "USER", "PAGE", "DayPreference", "query_weights", "preferred_days", "lexical_candidates",
           "lexical_ranking", "vector_query", "candidate_views", "archived_view_wanted", "best_views", "fuse",
           "WHOLE_AT_ARCHIVE_CHARS"]

Id = TypeVar("Id", bound=Hashable)

MIN_SCORE = 0.2  # BM25 score under which a page is not a hit
TIME_WEIGHT = 0.25  # of a query term that only a time it names holds (step 1)
USER, PAGE = "user", "page"  # the views of a page the vector half embeds
WHOLE_AT_ARCHIVE_CHARS = 1200  # a page's whole text embedded when it is archived up to this long (CHUNK_CHARS)


def query_weights(query: str, entity_boost: float = 1.0, counting: bool = False) -> dict[str, float]:
    """BM25 weights of the query's terms (module docstring, step 1); ``counting``: the query stands for a message that
    asks for a count (its words may no longer say so: "many rare figurines")."""
    terms = dict.fromkeys(content_terms(query), 1.0)
    weights = boosted_query(terms, query, entity_boost)
    timeless = without_times(query)
    if timeless != query:
        kept = set(tokenize(timeless))
        weights = {term: weight if term in kept else weight * TIME_WEIGHT for term, weight in weights.items()}
    if counting or counts(query):
        weights.update({counted_form(term): weight for term, weight in list(weights.items())})
    return weights


@dataclass(frozen=True, slots=True)
class DayPreference:
    """The days a query names (``span``), today, and the day of each page (step 2)."""

    span: DaySpan
    today: _dt.date
    days: Mapping[Any, _dt.date]

    def held(self) -> list[Hashable]:
        """The pages of the asked days, or told of after them up to today."""
        first, last = self.span.first, max(self.span.last, self.today)
        return [doc for doc, day in self.days.items() if first <= day <= last]

    def prefer(self, ranking: Sequence[tuple[Id, float]], keep_scores: bool = False) -> list[tuple[Id, float]]:
        return prefer_days(ranking, self.days.get, self.span, keep_scores, until=self.today)


@memoised(1024, 4 * 2**20)
def vector_query(query: str) -> str:
    """What the vector half embeds of a query: the query without the times it names (step 1: they say when; the
    days rank the pages in step 2), unless that leaves nothing. Kept for the last texts asked: a turn asks it of the
    same query several times (its vector started, looked up, searched), each a dozen regular-expression passes."""
    timeless = without_times(query)
    if timeless == query:
        return query
    return " ".join(timeless.split()) or query


def preferred_days(query: str, today: _dt.date, days: Callable[[], Mapping[Any, _dt.date]]
                   ) -> DayPreference | None:
    """The day preference of the query (step 2), or None when it names no time; ``days()``: each page's day, asked
    only when it names one."""
    span = asked_days(query, today)
    return None if span is None else DayPreference(span, today, days())


def lexical_candidates(index: BM25Index, weights: Mapping[str, float], count: int,
                       days: DayPreference | None = None) -> list[tuple[Hashable, float]]:
    """BM25's best ``count`` (id, score), and with ``days`` the best ``count`` of the pages it holds (step 3); best
    first."""
    found = index.search_weighted(weights, k=count, min_score=MIN_SCORE)
    if days is None or len(found) < count:  # (fewer: every page that scores is found already)
        return found
    held = days.held()
    if len(held) >= len(index):
        return found
    dated = index.search_weighted(weights, k=count, min_score=MIN_SCORE, within=held)
    seen = {doc for doc, _ in found}
    return sorted([*found, *(pair for pair in dated if pair[0] not in seen)], key=lambda pair: -pair[1])


def lexical_ranking(candidates: Sequence[tuple[Id, float]], days: DayPreference | None) -> list[tuple[Id, float]]:
    """The search without vectors: the candidates, those of the preferred days climbing; BM25 scores kept (the
    floors of the push and of memory injection compare them)."""
    return list(candidates) if days is None else days.prefer(candidates, keep_scores=True)


def candidate_views(candidates: Iterable[Id], has_user_words: Callable[[Id], bool]) -> list[tuple[Id, str]]:
    """(id, view) in the order the vector half embeds them (step 4): the user words of each candidate that has
    some, then each whole page."""
    ids = list(candidates)
    return [*((doc, USER) for doc in ids if has_user_words(doc)), *((doc, PAGE) for doc in ids)]


def archived_view_wanted(view: str, has_user_words: bool, whole_chars: int) -> bool:
    """Whether a page gets this view embedded in the background (when archived, or when a search finds it without
    it): its user words, and its whole text when it has no user words or is short (at most
    ``WHOLE_AT_ARCHIVE_CHARS``: one input of the packaged model). A long page's whole text is never embedded: what
    the user said names what a page is about at a fraction of the text (recall@5 the same as with both views on
    LongMemEval dev, MADial-Bench and MemoryBank; docs/memory.md), and the model's cost is in its tokens."""
    return view == USER or not has_user_words or whole_chars <= WHOLE_AT_ARCHIVE_CHARS


def best_views(cosines: Iterable[tuple[tuple[Id, str], float]]) -> list[tuple[Id, float]]:
    """(id, cosine of its best view), in the order the ids first appear."""
    best: dict[Id, float] = {}
    for (doc, _view), cosine in cosines:
        best[doc] = max(cosine, best.get(doc, cosine))
    return list(best.items())


def fuse(candidates: Sequence[tuple[Id, float]], cosines: Sequence[tuple[Id, float]], limit: int,
         days: DayPreference | None = None, lexical_weight: float = 1.0, vector_weight: float = 1.0,
         min_cosine: float | None = None) -> list[tuple[Id, float]]:
    """The fused ranking (step 5): ``cosines`` of the candidates (or, embeddings_pages=archive, of the nearest
    pages, those under ``min_cosine`` left out)."""
    return fuse_lexical_and_vector(candidates, cosines, limit=limit, lexical_weight=lexical_weight,
                                   vector_weight=vector_weight, min_cosine=min_cosine,
                                   reorder=None if days is None else days.prefer)
