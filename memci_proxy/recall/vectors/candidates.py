"""The vector half of the recall search, spent where it pays: the candidates of a search re-ordered by the vectors
that exist.

The default (``embeddings_pages = candidates``). A search asks BM25 for its candidates first; this embeds the query
alone (within ``query_deadline_s``) and gives the cosine with the query of each candidate whose vector it holds, so
that the fusion (memci_proxy.recall.search.fusion) re-orders what BM25 found; a candidate without a vector keeps its
lexical rank. No page is embedded on the request path: the views of the pages a turn archived are embedded after it, in
the background (``prefetch``, memci_proxy.recall.vectors.background), and a search's candidates whose views have no
vector yet (after a restart, or dropped from a full backlog) are queued there first. Which views a page gets is the
caller's ``wanted`` (memci_proxy.recall.search.ranking.archived_view_wanted: its user words, its whole text only when
short or without user words); a view judged unwanted is remembered by digest and not read again. A vector is kept by the
digest of its page's text in a bounded map (``cache_max_bytes``), so a page is embedded once, in any conversation.

Each candidate's text is cut to ``page_chars`` characters (pieces spread over all of it); a search queues at most
``search_chars`` characters of its candidates' text, best lexical candidates first. Vectors are not stored: they are
derived data, embedded again after a restart (in the background, when a search finds the page).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncio
import logging

import numpy as np

from memci_proxy.caches import BoundedLru
from memci_proxy.recall.vectors.background import MAX_VIEWS, BackgroundEmbedding
from memci_proxy.recall.vectors.local_embedder import chunk_text
from memci_proxy.recall.vectors.index import Embedder, VectorSearchFailed

log = logging.getLogger("memci.recall")

__all__ = ["CandidateVectors", "PAGE_CHARS", "QUERY_DEADLINE_S", "SEARCH_CHARS", "page_sample"]

PAGE_CHARS = 2400  # of one candidate page (2 of the local model's chunks: its start and its end when longer)
SEARCH_CHARS = 24_000  # of candidate text one search queues for embedding (20 chunks)
QUERY_DEADLINE_S = 0.05  # the query's vector or a lexical search (the default model takes 2-5 ms)


def page_sample(text: str, limit: int = PAGE_CHARS, piece: int = 1200) -> str:
    """``text`` when it holds at most ``limit`` characters, else pieces of it spread from its start to its end."""
    if len(text) <= limit:
        return text
    piece = max(1, min(piece, limit))
    return "\n".join(chunk_text(text, piece, max(1, limit // piece)))


class CandidateVectors:
    """``await cosines(query, candidates, text_of)``: (label, cosine) of the candidates that have a vector, in their
    order; ``prefetch(views, text_of)`` after a turn that archived pages."""

    candidates_only = True

    def __init__(self, embedder: Embedder, cache_max_bytes: int = 64 * 2**20, page_chars: int = PAGE_CHARS,
                 search_chars: int = SEARCH_CHARS, metrics: Any = None, query_deadline_s: float = QUERY_DEADLINE_S,
                 max_lag_s: float = 5.0, max_views: int = MAX_VIEWS) -> None:
        self.embedder = embedder
        self.page_chars = page_chars
        self.search_chars = search_chars
        self.query_deadline_s = query_deadline_s
        self.metrics = metrics
        self._by_digest: BoundedLru[str, np.ndarray] = BoundedLru(
            "candidate_vectors", 1 << 20, cache_max_bytes, size_of=lambda k, v: 96 + len(k) + v.nbytes)
        self.background = BackgroundEmbedding(
            self.embedder.embed, self._keep, lambda digest: self._by_digest.peek(digest) is not None,
            max_views=max_views, max_lag_s=max_lag_s, metrics=metrics)
        self._reading: set[asyncio.Task[None]] = set()
        self._unwanted: BoundedLru[str, bool] = BoundedLru(  # digests of views ``wanted`` turned down
            "candidate_vectors_unwanted", 1 << 18, 8 * 2**20, size_of=lambda k, v: 64 + len(k))
        self._remembered: BoundedLru[str, dict[str, None]] = BoundedLru(  # conversation -> labels indexed
            "candidate_vectors_remembered", 1024, 8 * 2**20, size_of=lambda k, v: 64 + len(k) + 64 * len(v))

    def _keep(self, digest: str, vector: Sequence[float]) -> None:
        self._by_digest.put(digest, np.asarray(vector, dtype=np.float32))

    async def cosines(self, query: str, candidates: Sequence[tuple[str, str]],
                      text_of: Callable[[str], Awaitable[str]],
                      wanted: Callable[[str, str], bool] | None = None) -> list[tuple[str, float]]:
        """``candidates``: (label, digest of the page's text), best lexical first; ``text_of(label)``: its text.
        Only the query is embedded here; candidates without a vector are queued for the background, those
        ``wanted(label, text)`` (all without it). Raises VectorSearchFailed (the caller stays lexical)."""
        query_vector = await self._query_vector(query)
        known: dict[str, np.ndarray] = {}
        missing: list[tuple[str, str]] = []
        for label, digest in candidates:
            vector = self._by_digest.get(digest)
            if vector is None:
                if self._unwanted.peek(digest) is None:
                    missing.append((label, digest))
            else:
                known[label] = vector
        if missing:
            self._read_later(missing, text_of, soon=True, wanted=wanted)
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

    def prefetch(self, views: Sequence[tuple[str, str]], text_of: Callable[[str], Awaitable[str]],
                 wanted: Callable[[str, str], bool] | None = None) -> None:
        """Views (label, digest) of pages just archived: embedded in the background, those ``wanted(label, text)``
        (the others never: turned down by digest, not read again)."""
        missing = [(label, digest) for label, digest in views
                   if self._by_digest.peek(digest) is None and self._unwanted.peek(digest) is None]
        if missing:
            self._read_later(missing, text_of, soon=False, wanted=wanted)

    def _read_later(self, views: list[tuple[str, str]], text_of: Callable[[str], Awaitable[str]], soon: bool,
                    wanted: Callable[[str, str], bool] | None = None) -> None:
        """The views' texts read in a task of their own (the search does not wait), then queued (``search_chars`` of
        a search's candidates at most)."""
        room = self.search_chars if soon else None

        async def read() -> None:
            nonlocal room
            texts = []
            try:
                for label, digest in views:
                    if room is not None and room <= 0:
                        break
                    whole = await text_of(label)
                    if wanted is not None and not wanted(label, whole):
                        self._unwanted.put(digest, True)
                        continue
                    text = page_sample(whole, self.page_chars)
                    if room is not None:
                        room -= len(text)
                    texts.append((digest, text))
            except Exception:
                log.exception("could not read pages to embed")
            self.background.submit(texts, soon=soon)

        task = asyncio.get_running_loop().create_task(read())
        self._reading.add(task)
        task.add_done_callback(self._reading.discard)

    async def _query_vector(self, query: str) -> Sequence[float]:
        embed_query = getattr(self.embedder, "embed_query", None)
        if embed_query is not None:
            running = asyncio.ensure_future(embed_query(query))
        else:
            running = asyncio.ensure_future(self.embedder.embed([query]))
        try:  # past the deadline the search goes lexical; the vector is still cached when it comes (shielded)
            got = await asyncio.wait_for(asyncio.shield(running), self.query_deadline_s)
        except TimeoutError:
            raise VectorSearchFailed("deadline") from None
        vector = got if embed_query is not None else (got[0] if got else None)
        if vector is None:
            raise VectorSearchFailed(self.embedder.last_failure or "embeddings")
        return vector

    def remember(self, conversation_id: str, pages: dict[str, str]) -> None:
        """Pages (label -> text) that entered the lexical index: their views are embedded after the turn
        (``take_remembered``, then ``prefetch``)."""
        if pages:
            labels = self._remembered.get(conversation_id) or {}
            labels.update(dict.fromkeys(pages))
            self._remembered.put(conversation_id, labels)

    def take_remembered(self, conversation_id: str) -> list[str]:
        return list(self._remembered.pop(conversation_id) or ())

    async def prepare(self, tenant: str, conversation_id: str) -> None:
        pass

    def mark_busy(self) -> None:
        self.background.mark_busy()

    def forget(self, conversation_id: str) -> None:
        self._remembered.pop(conversation_id)

    async def drain(self) -> None:
        """Until the views queued are embedded (tests, evaluations)."""
        while self._reading:
            await asyncio.gather(*list(self._reading), return_exceptions=True)
        await self.background.drain()

    async def close(self) -> None:
        await self.background.close()
        close = getattr(self.embedder, "close", None)
        if close is not None:
            await close()
