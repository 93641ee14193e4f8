"""Fusion of a lexical (BM25) ranking and a vector (cosine) ranking (pure).

Reciprocal-rank fusion (Cormack, Clarke & Buettcher, 2009)::

    fused(d) = sum over rankings r containing d of  weight_r / (rrf_k + rank_r(d))      (rank from 1)

Only ranks are used, so BM25's unbounded scores and cosine similarities in [-1, 1] need no calibration
against each other. Within one ranking an id counts once, at its best (first) position; the output holds
each id once. Equal fused scores keep the order of first appearance (lexical ranking first).

The recall search fuses its two halves with an anchor (``fuse_lexical_and_vector``): the lexical ranking's top two
hits stay first and second, whatever the vectors say. Measured on every set the project has (docs/memory.md), the
vector half helps by re-ordering what BM25 found below its best hits, and hurts where it displaces a confident
lexical hit (a name, a number, a date the query repeats): the anchor keeps those hits and leaves the re-ordering.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = [
    "DEFAULT_ANCHOR",
    "DEFAULT_RRF_K",
    "reciprocal_rank_fusion",
    "fuse_lexical_and_vector",
    "cosine_similarity",
    "rank_by_cosine",
]

DEFAULT_RRF_K = 60.0
DEFAULT_ANCHOR = 2  # lexical hits that keep their places at the top of the fused ranking

Id = TypeVar("Id", bound=Hashable)


def reciprocal_rank_fusion(
    rankings: Sequence[Iterable[Id]],
    rrf_k: float = DEFAULT_RRF_K,
    weights: Sequence[float] | None = None,
    limit: int | None = None,
) -> list[tuple[Id, float]]:
    """Fuse best-first id rankings into one best-first list of ``(id, fused score)``."""
    if rrf_k < 0:
        raise ValueError("rrf_k must be >= 0")
    if weights is not None and len(weights) != len(rankings):
        raise ValueError("one weight per ranking")
    fused: dict[Id, float] = {}
    first_seen: dict[Id, int] = {}
    for index, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[index]
        seen: set[Id] = set()
        rank = 0
        for doc_id in ranking:
            if doc_id in seen:
                continue
            seen.add(doc_id)
            rank += 1
            fused[doc_id] = fused.get(doc_id, 0.0) + weight / (rrf_k + rank)
            first_seen.setdefault(doc_id, len(first_seen))
    order = sorted(fused, key=lambda d: (-fused[d], first_seen[d]))
    if limit is not None:
        order = order[: max(limit, 0)]
    return [(doc_id, fused[doc_id]) for doc_id in order]


def fuse_lexical_and_vector(
    lexical: Sequence[tuple[Id, float]],
    vector: Sequence[tuple[Id, float]],
    limit: int = 10,
    rrf_k: float = DEFAULT_RRF_K,
    lexical_weight: float = 1.0,
    vector_weight: float = 1.0,
    min_cosine: float | None = None,
    anchor: int = DEFAULT_ANCHOR,
    reorder: Callable[[list[tuple[Id, float]]], list[tuple[Id, float]]] | None = None,
) -> list[tuple[Id, float]]:
    """Fuse ``(id, bm25 score)`` and ``(id, cosine)`` lists (any order) into ``limit`` best ``(id, rrf score)``.

    Each list is ranked by its own score, descending (stable for ties). ``min_cosine`` drops vector
    candidates below that similarity before fusion. With an empty vector list the result is the lexical
    ranking (the degradation when no embeddings are configured), and vice versa.

    ``reorder``: applied to the fused ranking and to the lexical one before the anchor is read (the recall
    search's day preference, memci_proxy.recall.dates.asked.prefer_days). ``anchor``: the lexical ranking's first
    ``anchor`` ids (after ``reorder``) come first, in their order, with the best fused score; so the fused top k always
    holds the top min(k, anchor) lexical hits where BM25 put them, and the vectors re-order what follows.
    """
    by_score = sorted(lexical, key=lambda pair: -pair[1])
    lexical_ranked = [doc_id for doc_id, _ in by_score]
    vector_pairs = [p for p in vector if min_cosine is None or p[1] >= min_cosine]
    vector_ranked = [doc_id for doc_id, _ in sorted(vector_pairs, key=lambda pair: -pair[1])]
    fused = reciprocal_rank_fusion(
        [lexical_ranked, vector_ranked], rrf_k=rrf_k, weights=[lexical_weight, vector_weight]
    )
    if reorder is not None:
        fused = reorder(fused)
    if anchor > 0 and by_score and fused:
        ranked = reorder(by_score) if reorder is not None else by_score
        kept = list(dict.fromkeys(doc_id for doc_id, _ in ranked))[:anchor]
        best = fused[0][1]
        fused = [*((doc_id, best) for doc_id in kept), *(pair for pair in fused if pair[0] not in kept)]
    return fused[: max(limit, 0)]


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine of two vectors of equal length; 0.0 when either is zero."""
    if len(a) != len(b):
        raise ValueError(f"vector lengths differ: {len(a)} != {len(b)}")
    dot = math.fsum(x * y for x, y in zip(a, b))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm else 0.0


def rank_by_cosine(
    query: Sequence[float], vectors: Mapping[Id, Sequence[float]], k: int = 10
) -> list[tuple[Id, float]]:
    """The ``k`` ids whose vectors are most similar to ``query``, best first (ties: mapping order)."""
    scored = ((cosine_similarity(query, vec), -i, doc_id) for i, (doc_id, vec) in enumerate(vectors.items()))
    return [(doc_id, cos) for cos, _, doc_id in heapq.nlargest(max(k, 0), scored, key=lambda t: (t[0], t[1]))]
