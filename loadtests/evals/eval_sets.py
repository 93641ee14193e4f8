"""Pieces of loadtests/evals/eval_recall.py shared by its data sets: the reference BM25 (``rank_bm25``, a library
the project does not use for its own search), a packaged embedding model as an EmbedFn, a progress line,
and MemoryBank's labelled probing questions (loadtests/evals/memorybank_evidence.json).

MemoryBank protocol: each exchange (the user's message and the answer) of a user's dated history is a page;
each labelled probing question is a query, asked as written, on the day of the history's last exchange (what
"on May 2nd" refers to: memci_proxy.recall.dates.asked); the relevant pages are the labelled ones.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.evals.evaldata import MemoryBankUser
from loadtests.progress import progress
from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.vectors.candidates import page_sample
from memci_proxy.recall.search.fusion import cosine_similarity, rank_by_cosine
from memci_proxy.recall.vectors.packaged_models import DEFAULT_MODEL
from memci_proxy.recall.reading.pagetext import index_terms, user_text, vector_text
from memci_proxy.recall.search.ranking import (MIN_SCORE, PAGE, USER, archived_view_wanted, best_views, candidate_views,
                                               fuse, lexical_candidates, lexical_ranking, preferred_days, query_weights,
                                               vector_query)
from memci_proxy.recall.resolver import FUSION_CANDIDATES, SEARCH_HITS
from memci_proxy.recall.lexical.text import tokenize

__all__ = ["EVIDENCE_FILE", "reference_ranking", "local_embed", "cached_embed", "memorybank_cases",
           "evaluate_memorybank", "page_text", "page_messages", "search_rankings", "user_views", "user_view_texts",
           "SEARCH_CANDIDATES"]

SEARCH_CANDIDATES = SEARCH_HITS * FUSION_CANDIDATES  # the lexical candidates of one proxy search (and the vectors')

EVIDENCE_FILE = Path(__file__).with_name("memorybank_evidence.json")
Row = tuple[float, float, float, float, float]


def reference_ranking(documents: Sequence[str], query_terms: Sequence[str]) -> list[int]:
    """Best-first document positions by rank_bm25's BM25Okapi (its defaults k1=1.5, b=0.75), with the project's
    tokenizer, so that only the scoring differs; documents scoring 0 are left out."""
    from rank_bm25 import BM25Okapi

    model = BM25Okapi([tokenize(d) or ["\u2205"] for d in documents])
    scores = model.get_scores(list(query_terms))
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    return [i for i in order if scores[i] > 0]


def local_embed(model: str = DEFAULT_MODEL) -> Callable[[list[str]], list[list[float]]]:
    """An EmbedFn over a packaged model (memci_proxy.recall.vectors.packaged_models), as the proxy runs it (chunking
    included)."""
    from memci_proxy.recall.vectors.local_embedder import LocalEmbedder

    embedder = LocalEmbedder(model)

    def embed(texts: list[str]) -> list[list[float]]:
        got = embedder._embed_now(texts)
        if got is None:
            raise RuntimeError(f"the packaged embedding model failed: {embedder.last_failure}")
        return got

    return embed


def cached_embed(embed: Callable[[list[str]], list[list[float]]], path: str | None = None
                 ) -> Callable[[list[str]], list[list[float]]]:
    """``embed`` asked only for texts it has not seen, by digest, in batches; ``path``: an .npz file that keeps the
    vectors between runs (``.save()`` writes it)."""
    from memci_proxy.recall.vectors.index import text_digest

    memo: dict[str, np.ndarray] = {}
    if path and Path(path).is_file():
        with np.load(path) as stored:
            memo.update((key, stored[key]) for key in stored.files)

    def cached(texts: list[str]) -> list[list[float]]:
        keys = [text_digest(t) for t in texts]
        missing = list(dict.fromkeys((k, t) for k, t in zip(keys, texts, strict=True) if k not in memo))
        for start in range(0, len(missing), 64):
            batch = missing[start : start + 64]
            for (key, _), vector in zip(batch, embed([t for _, t in batch]), strict=True):
                memo[key] = np.asarray(vector, dtype=np.float32)
        return [memo[k] for k in keys]

    def save() -> None:
        if path:
            np.savez(path, **memo)

    cached.save = save  # type: ignore[attr-defined]
    return cached


def search_rankings(
    index: BM25Index,
    query: str,
    weights: Mapping[str, float],
    query_vector: Sequence[float] | None,
    page_vectors: Mapping[Any, Sequence[float]],
    day_of: Callable[[Any], dt.date | None] | None = None,
    today: dt.date | None = None,
    min_cosine: float = 0.2,
    vector_weight: float = 1.0,
    user_vectors: Mapping[Any, Sequence[float]] | None = None,
    whole_archive: bool = True,
    page_chars: Mapping[Any, int] | None = None,
) -> dict[str, list[Hashable]]:
    """Best-first ids of the proxy's search over ``index`` (memci_proxy.recall.search.ranking, the steps of
    memci_proxy.recall.resolver.RecallResolver.search): ``lexical`` (the search without vectors: BM25 with ``weights``,
    the pages of the days ``query`` names joining and climbing; then the rest of BM25's ranking), and with a query
    vector ``vector`` (cosine over every page), ``default`` (embeddings_pages=candidates: the vectors of the lexical
    candidates' views re-order them under the top lexical hits) and ``archive`` (embeddings_pages=archive: the
    nearest pages may join them). The default has the vectors of every candidate's views: the pages were embedded in
    the background after the turns that archived them (a search that comes before that is ``lexical``).
    ``user_vectors``: the vectors of the pages' user words (pages without any left out). ``user-first``: the
    default at a page's first search, the vectors the proxy made when it archived the page
    (memci_proxy.recall.search.ranking.archived_view_wanted: its user words, its whole text when it has none or is
    short, ``page_chars`` long; the whole text of the rest is embedded when a search first finds them).
    ``whole_archive`` False: the rankings over every page's vector (``vector``, ``archive``) left out, so that only the
    candidates' vectors are read (``page_vectors`` may embed on demand)."""
    days = None
    if day_of is not None and today is not None:
        days = preferred_days(query, today, lambda: {i: day for i in index.doc_ids if (day := day_of(i)) is not None})
    candidates = lexical_candidates(index, weights, SEARCH_CANDIDATES, days)
    lexical = [i for i, _ in lexical_ranking(candidates, days)]
    shown = set(lexical)
    rest = [i for i, _ in index.search_weighted(weights, k=len(index), min_score=MIN_SCORE) if i not in shown]
    out: dict[str, list[Hashable]] = {"lexical": [*lexical, *rest]}
    if query_vector is None:
        return out
    users = user_vectors or {}
    vectors = {USER: users, PAGE: page_vectors}
    views = candidate_views([i for i, _ in candidates if i in page_vectors], users.__contains__)
    cosines = best_views((view, cosine_similarity(query_vector, vectors[view[1]][view[0]])) for view in views)
    limit = max(SEARCH_CANDIDATES, len(candidates))
    out["default"] = [i for i, _ in fuse(candidates, cosines, limit, days, vector_weight=vector_weight)]
    chars = page_chars or {}
    first = [view for view in views if archived_view_wanted(view[1], view[0] in users, chars.get(view[0], 1 << 30))]
    cosines = best_views((view, cosine_similarity(query_vector, vectors[view[1]][view[0]])) for view in first)
    out["user-first"] = [i for i, _ in fuse(candidates, cosines, limit, days, vector_weight=vector_weight)]
    if not whole_archive:
        return out
    vector = rank_by_cosine(query_vector, page_vectors, k=len(page_vectors))
    nearest = [(i, c) for i, c in vector[:SEARCH_CANDIDATES] if c > 0]
    out["archive"] = [i for i, _ in fuse(candidates, nearest, limit, days, vector_weight=vector_weight,
                                         min_cosine=min_cosine)]
    out["vector"] = [i for i, _ in vector]
    return out


def embedded_text(text: str) -> str:
    """What the proxy embeds of a candidate page (memci_proxy.recall.vectors.candidates.page_sample)."""
    return page_sample(text)


def user_view_texts(pages: Sequence[list[dict[str, Any]]]) -> dict[int, str]:
    """The pages' user words as the proxy embeds them (memci_proxy.recall.reading.pagetext.user_text, cut as a candidate
    page is), by position; pages without user words, or of user words only (one view), left out."""
    return {i: embedded_text(t) for i, t in enumerate(user_text(page) for page in pages)
            if t and t != vector_text(pages[i])}


def user_views(pages: Sequence[list[dict[str, Any]]], embed: Callable[[list[str]], list[list[float]]] | None
               ) -> tuple[dict[int, Any], dict[int, int]]:
    """Vectors and lengths of the pages' user words (``user_view_texts``), by position; no vectors without
    ``embed``."""
    texts = user_view_texts(pages)
    if embed is None or not texts:
        return {}, {i: len(t) for i, t in texts.items()}
    return dict(zip(texts, embed(list(texts.values())), strict=True)), {i: len(t) for i, t in texts.items()}


def page_messages(user: MemoryBankUser, position: int) -> list[dict[str, str]]:
    """A MemoryBank exchange as the proxy pages it: the user's message and the answer."""
    exchange = user.exchanges[position]
    return [{"role": "user", "content": exchange.query}, {"role": "assistant", "content": exchange.response}]


def page_text(user: MemoryBankUser, position: int) -> str:
    exchange = user.exchanges[position]
    return f"[{exchange.date}] {exchange.query}\n{exchange.response}"


def memorybank_cases(users: list[MemoryBankUser], path: Path = EVIDENCE_FILE) -> list[tuple[MemoryBankUser, str, list[int]]]:
    """(user, question, relevant exchange positions) of every labelled question."""
    labels = json.loads(path.read_text(encoding="utf-8"))["labels"]
    cases = []
    for user in users:
        for index, relevant in sorted(labels.get(user.name, {}).items(), key=lambda kv: int(kv[0])):
            cases.append((user, user.probing_questions[int(index)], [int(r) for r in relevant]))
    return cases


def evaluate_memorybank(
    users: list[MemoryBankUser],
    embed: Callable[[list[str]], list[list[float]]] | None,
    score: Callable[[Sequence[object], Sequence[object]], Row],
    vector_weight: float = 1.0,
    min_cosine: float | None = 0.2,
    entity_boost: float = 1.0,
    bars: bool | None = None,
    dates: bool = True,
    user_weight: int = 1,
) -> dict[str, list[Row]]:
    """Rows per ranking (lexical, reference-bm25, and vector, default and archive when ``embed`` is given: see
    search_rankings). Each exchange is a page of two messages, indexed as the proxy indexes it (``user_weight``:
    memci_proxy.recall.reading.pagetext.index_terms) and dated by its day; ``bars``: as loadtests.progress.progress
    (None: no progress); ``dates``: the pages of the days a question names climb, as in the proxy's search."""
    from memci_proxy.recall.reading.pagetext import index_text

    cases = memorybank_cases(users)
    rows: dict[str, list[Row]] = {"lexical": [], "reference-bm25": []}
    if embed is not None:
        rows["vector"], rows["default"], rows["user-first"], rows["archive"] = [], [], [], []
    indexes: dict[str, tuple[BM25Index, list[str], dict[int, Any], tuple[dict[int, Any], dict[int, int]]]] = {}
    searching = progress(len(cases), "MemoryBank: searching", bars, "questions")
    for user, question, relevant in cases:
        searching.advance()
        if user.name not in indexes:
            pages = [page_messages(user, i) for i in range(len(user.exchanges))]
            texts = [index_text(p) for p in pages]
            index = BM25Index()
            for i, page in enumerate(pages):
                index.add_terms(i, index_terms(page, user_weight=user_weight))
            vectors = dict(enumerate(embed([embedded_text(t) for t in texts]))) if embed is not None else {}
            users = user_views(pages, embed)
            indexes[user.name] = (index, texts, vectors, users)
        index, texts, vectors, users = indexes[user.name]
        weights = query_weights(question, entity_boost)
        days = {i: dt.date.fromisoformat(e.date) for i, e in enumerate(user.exchanges)}
        ranked = search_rankings(index, question, weights, embed([vector_query(question)])[0] if embed is not None else None,
                                 vectors, days.get if dates else None, max(days.values()),
                                 min_cosine=min_cosine if min_cosine is not None else -1.0,
                                 vector_weight=vector_weight, user_vectors=users[0],
                                 page_chars={i: len(vector_text(p)) for i, p in enumerate(pages)})
        rows["reference-bm25"].append(score(reference_ranking(texts, tokenize(question)), relevant))
        for name, ranking in ranked.items():
            rows[name].append(score(ranking, relevant))
    searching.close()
    return rows
