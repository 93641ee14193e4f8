"""The vector half of the recall search, spent where it pays: the candidates of a search, embedded when it runs.

The default (``embeddings_pages = candidates``). A search asks BM25 for its candidates first; this embeds the query
and those candidate pages whose vectors it does not hold yet, and gives each candidate's cosine with the query, so
that the fusion (proxy.recall.fusion) re-orders what BM25 found. Nothing is embedded when a page is archived: in a
long chat most archived pages are never searched, and embedding every one of them in the background was half of the
managed proxy's CPU (measured: docs/memory.md). A page's vector is kept by the digest of its text in a bounded map
(``cache_max_bytes``), so a page is embedded once while it stays a candidate of later searches, in any conversation.

The cost of one search is bounded: each candidate's text is cut to ``page_chars`` characters (pieces spread over
all of it) and at most ``search_chars`` characters of candidate text are embedded per search, best lexical
candidates first; a candidate left without a vector keeps only its lexical rank in the fusion. Vectors are not
stored: they are derived data, embedded again after a restart when a search needs them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from proxy.caches import BoundedLru
from proxy.recall.local_embedder import chunk_text
from proxy.recall.vector_index import Embedder, VectorSearchFailed

__all__ = ["CandidateVectors", "PAGE_CHARS", "SEARCH_CHARS", "page_sample", "within_budget"]

PAGE_CHARS = 2400  # of one candidate page (2 of the local model's chunks: its start and its end when longer)
SEARCH_CHARS = 24_000  # of candidate text embedded by one search (20 chunks: 0.2-0.4 s of CPU with the default model)


def page_sample(text: str, limit: int = PAGE_CHARS, piece: int = 1200) -> str:
    """``text`` when it holds at most ``limit`` characters, else pieces of it spread from its start to its end."""
    if len(text) <= limit:
        return text
    piece = max(1, min(piece, limit))
    return "\n".join(chunk_text(text, piece, max(1, limit // piece)))


def within_budget(lengths: Sequence[tuple[Any, int]], search_chars: int = SEARCH_CHARS) -> list[Any]:
    """The candidates (id, characters to embed), best first, that one search embeds: taken in order while characters
    are left (the one that crosses the bound included)."""
    chosen, room = [], search_chars
    for doc_id, length in lengths:
        if room <= 0:
            break
        chosen.append(doc_id)
        room -= length
    return chosen


class CandidateVectors:
    """``await cosines(query, candidates, text_of)``: (label, cosine) of the candidates, in their order."""

    candidates_only = True

    def __init__(self, embedder: Embedder, cache_max_bytes: int = 64 * 2**20, page_chars: int = PAGE_CHARS,
                 search_chars: int = SEARCH_CHARS, metrics: Any = None) -> None:
        self.embedder = embedder
        self.page_chars = page_chars
        self.search_chars = search_chars
        self.metrics = metrics
        self._by_digest: BoundedLru[str, np.ndarray] = BoundedLru(
            "candidate_vectors", 1 << 20, cache_max_bytes, size_of=lambda k, v: 96 + len(k) + v.nbytes)

    async def cosines(self, query: str, candidates: Sequence[tuple[str, str]],
                      text_of: Callable[[str], Awaitable[str]]) -> list[tuple[str, float]]:
        """``candidates``: (label, digest of the page's text), best lexical first; ``text_of(label)``: its text.
        Raises VectorSearchFailed (the caller stays lexical)."""
        query_vector = await self._query_vector(query)
        known: dict[str, np.ndarray] = {}
        missing: list[tuple[str, str, str]] = []  # label, digest, text
        room = self.search_chars
        for label, digest in candidates:
            vector = self._by_digest.get(digest)
            if vector is not None:
                known[label] = vector
                continue
            if room <= 0:
                continue
            text = page_sample(await text_of(label), self.page_chars)
            room -= len(text)
            missing.append((label, digest, text))
        if missing:
            got = await self._embed([text for _, _, text in missing])
            for (label, digest, _), vector in zip(missing, got, strict=True):
                row = np.asarray(vector, dtype=np.float32)
                self._by_digest.put(digest, row)
                known[label] = row
        if self.metrics is not None:
            self.metrics.search_pages_embedded.inc(len(missing))
        q = np.asarray(query_vector, dtype=np.float32)
        qn = float(np.linalg.norm(q))
        out = []
        for label, _ in candidates:
            vector = known.get(label)
            if vector is None:
                continue
            norm = float(np.linalg.norm(vector)) * qn
            out.append((label, float(vector @ q) / norm if norm else 0.0))
        return out

    async def _query_vector(self, query: str) -> Sequence[float]:
        embed_query = getattr(self.embedder, "embed_query", None)
        if embed_query is not None:
            vector = await embed_query(query)
        else:
            got = await self.embedder.embed([query])
            vector = got[0] if got else None
        if vector is None:
            raise VectorSearchFailed(self.embedder.last_failure or "embeddings")
        return vector

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        embed = getattr(self.embedder, "embed_search", None) or self.embedder.embed
        got = await embed(texts)
        if got is None or len(got) != len(texts):
            raise VectorSearchFailed(self.embedder.last_failure or "embeddings")
        return got

    # What the turn path calls on the vector half: nothing to do when only candidates are embedded.
    def remember(self, conversation_id: str, pages: dict[str, str]) -> None:
        pass

    async def prepare(self, tenant: str, conversation_id: str) -> None:
        pass

    def mark_busy(self) -> None:
        pass

    def forget(self, conversation_id: str) -> None:
        pass

    async def close(self) -> None:
        close = getattr(self.embedder, "close", None)
        if close is not None:
            await close()
