"""The vector half of the recall search: embed archived pages, keep their vectors in PostgreSQL, find the
nearest pages of a conversation to a query.

When pages are embedded: off the answer path, by a background task started after the turn that archived
them (``prepare``); a search finds the pages still pending (a restarted proxy, a conversation dropped from
this process's memory) and starts that task too, or embeds up to ``inline_pages`` of them with the query
when configured so (0 by default: the recall path embeds the query alone). Vectors are stored with a
digest of the embedded text, so a restarted proxy re-embeds nothing that is already stored and a page whose
text changed is embedded again; within a process a bounded map digest -> vector serves a text seen before
(a forked conversation's pages) without the model.

The nearest pages come from this process's vectors when it holds every vector of the conversation (an
exact cosine scan in numpy, bounded in bytes: ``cache_max_bytes``), else from the store (pgvector).

Background embedding waits for a moment without turn starts (``mark_busy``), so that it runs between turns rather
than beside them, but a page never waits longer than ``max_lag_s`` for it (memci_proxy.recall.vectors.backlog).

Pages that could not be embedded (model or endpoint failing) stay pending and are tried again at the next
search or archive.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import xxhash

from memci_proxy.caches import BoundedLru
from memci_proxy.recall.vectors.backlog import EmbeddingBacklog
from memci_proxy.store.ports import PageVectorStore

log = logging.getLogger("memci.recall")
ARRIVED_MAX_BYTES = 64 * 2**20  # page texts waiting to be embedded, per process
# Conversations' stored digests and page texts still to embed (taken from the arrived ones), per process.
CONVERSATIONS_MAX_BYTES = 64 * 2**20

__all__ = ["Embedder", "PageVectors", "VectorSearchFailed", "text_digest"]


class Embedder(Protocol):
    """What PageVectors needs of an embeddings client (memci_proxy.recall.vectors.endpoint.EmbeddingsClient)."""

    dimension: int | None
    last_failure: str | None

    @property
    def model_name(self) -> str: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]] | None: ...


class _LocalVectors:
    """One conversation's vectors held in this process: label -> (digest, vector); a matrix built on demand."""

    __slots__ = ("rows", "_matrix", "_labels", "_covered")

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, Sequence[float]]] = {}
        self._matrix: np.ndarray | None = None
        self._labels: list[str] = []
        self._covered = -1  # the digests' version last found covered (a search compares versions, not pages)

    def add(self, rows: Sequence[tuple[str, str, Sequence[float]]]) -> None:
        for number, digest, vector in rows:
            self.rows[number] = (digest, np.asarray(vector, dtype=np.float32))
        self._matrix = None
        self._covered = -1

    def covers(self, digests: dict[str, str], version: int) -> bool:
        """Whether it holds a vector of each page's digest; ``version`` names the digests' content."""
        if version != self._covered:
            if not all(self.rows.get(n, ("",))[0] == d for n, d in digests.items()):
                return False
            self._covered = version
        return True

    def nbytes(self) -> int:
        return 256 + sum(96 + 4 * len(v) for _, v in self.rows.values())

    def nearest(self, query: Sequence[float], k: int) -> list[tuple[str, float]]:
        q = np.asarray(query, dtype=np.float32)
        if self._matrix is None:
            same = [(n, v) for n, (_, v) in self.rows.items() if len(v) == len(q)]
            self._labels = [n for n, _ in same]
            matrix = np.asarray([v for _, v in same], dtype=np.float32).reshape(len(same), len(q))
            norms = np.linalg.norm(matrix, axis=1, keepdims=True)
            self._matrix = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
        if not self._labels or k <= 0:
            return []
        qn = float(np.linalg.norm(q))
        scores = self._matrix @ (q / qn if qn else q)
        top = np.argsort(-scores, kind="stable")[:k]
        return [(self._labels[i], float(scores[i])) for i in top]


def text_digest(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


class VectorSearchFailed(Exception):
    """The query could not be embedded or searched; ``reason`` labels the fallback metric."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_DIGEST_VERSIONS = itertools.count()


class _Conversation:
    __slots__ = ("digests", "version", "pending", "backlog_task")

    def nbytes(self) -> int:
        return 256 + sum(len(n) + len(d) + 128 for n, d in self.digests.items()) + sum(
            len(n) + len(t) + 128 for n, t in self.pending.items())

    def __init__(self, digests: dict[str, str]) -> None:
        self.digests = digests  # page number -> digest of the stored vector's text
        self.version = next(_DIGEST_VERSIONS)  # a new number at each change of the digests, unique in the process
        self.pending: dict[str, str] = {}  # page number -> text still to embed
        self.backlog_task: asyncio.Task[None] | None = None


class PageVectors:
    def __init__(
        self,
        store: PageVectorStore,
        embedder: Embedder,
        inline_pages: int = 32,
        create_index: bool = True,
        capacity: int = 1024,
        cache_max_bytes: int = 64 * 2**20,
        max_lag_s: float = 5.0,
        metrics: Any = None,
    ) -> None:
        """``max_lag_s``: a page archived that long ago is embedded even while turns keep coming. ``metrics``: a
        memci_proxy.metrics.Metrics (the backlog's gauges and the lag histogram)."""
        self.store = store
        self.embedder = embedder
        self.inline_pages = max(0, inline_pages)
        self.create_index = create_index
        self.capacity = capacity
        self._conversations: BoundedLru[str, _Conversation] = BoundedLru(
            "page_vectors_conversations", capacity, CONVERSATIONS_MAX_BYTES, size_of=lambda _k, c: c.nbytes(),
            on_drop=self._dropped)
        self._indexed_dims: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.backlog = EmbeddingBacklog(max_lag_s=max_lag_s, lag=getattr(metrics, "page_embedding_lag", None))
        if metrics is not None:
            self.backlog.expose(metrics.embedding_backlog_pages, metrics.embedding_backlog_age)
        # conversation -> pages not yet compared with the store: bounded like the conversations and in bytes (a
        # conversation dropped here keeps its lexical index; its new pages are embedded when next re-indexed)
        self._arrived: BoundedLru[str, dict[str, str]] = BoundedLru(
            "page_vectors_arrived", capacity, ARRIVED_MAX_BYTES,
            size_of=lambda k, pages: 64 + len(k) + sum(len(n) + len(t) + 64 for n, t in pages.items()))
        self._local: BoundedLru[str, _LocalVectors] = BoundedLru(
            "page_vectors_local", capacity, cache_max_bytes, size_of=lambda _k, v: v.nbytes())
        self._by_digest: BoundedLru[str, Sequence[float]] = BoundedLru(
            "page_vectors_by_digest", 4096, max(1, cache_max_bytes // 4), size_of=lambda k, v: 96 + len(k) + 4 * len(v))

    def remember(self, conversation_id: str, pages: dict[str, str]) -> None:
        """Pages (number -> text) that entered the lexical index: embedded at the next ``nearest`` call."""
        if pages:
            waiting = self._arrived.get(conversation_id) or {}
            waiting.update(pages)
            self._arrived.put(conversation_id, waiting)

    async def prepare(self, tenant: str, conversation_id: str) -> None:
        """Embed the pages remembered for the conversation in the background (after the turn that archived them)."""
        try:
            conversation = await self._conversation(tenant, conversation_id)
        except VectorSearchFailed:
            return
        self._take_arrived(conversation_id, conversation)
        if conversation.pending:
            self._start_backlog(tenant, conversation_id, conversation)

    def _take_arrived(self, conversation_id: str, conversation: _Conversation) -> None:
        for number, text in (self._arrived.pop(conversation_id) or {}).items():
            if conversation.digests.get(number) != text_digest(text):
                conversation.pending[number] = text
                self.backlog.arrived(conversation_id, [number])
            elif conversation.pending.pop(number, None) is not None:
                self.backlog.embedded(conversation_id, [number])
        self._conversations.resize(conversation_id)  # its pending texts count in the cache's bytes

    async def nearest(self, tenant: str, conversation_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """(page number, cosine) of the conversation's pages nearest to ``query``, best first. Pages remembered
        since the last call are embedded in the background (or ``inline_pages`` of them with the query).
        Raises VectorSearchFailed (the caller goes lexical)."""
        conversation = await self._conversation(tenant, conversation_id)
        self._take_arrived(conversation_id, conversation)
        inline = list(conversation.pending.items())[: self.inline_pages]
        embed_query = getattr(self.embedder, "embed_query", None)
        if embed_query is not None and not inline:
            query_vector = await embed_query(query)
            page_vectors: list[list[float]] = []
            if query_vector is None:
                raise VectorSearchFailed(self.embedder.last_failure or "embeddings")
        else:
            vectors = await self.embedder.embed([query, *(text for _, text in inline)])
            if vectors is None:
                raise VectorSearchFailed(self.embedder.last_failure or "embeddings")
            query_vector, page_vectors = vectors[0], vectors[1:]
        if inline:
            await self._store(tenant, conversation_id, conversation, inline, page_vectors)
        if conversation.pending:
            self._start_backlog(tenant, conversation_id, conversation)
        local = self._local.get(conversation_id)
        if local is not None and local.covers(conversation.digests, conversation.version):
            return local.nearest(query_vector, k)
        try:
            return await self.store.nearest_pages(tenant, conversation_id, self.embedder.model_name, query_vector, k)
        except Exception:
            log.exception("vector search failed")
            raise VectorSearchFailed("store") from None

    async def _conversation(self, tenant: str, conversation_id: str) -> _Conversation:
        conversation = self._conversations.get(conversation_id)
        if conversation is None:
            try:
                digests = await self.store.page_vector_digests(tenant, conversation_id, self.embedder.model_name)
            except Exception:
                log.exception("could not read stored page vectors")
                raise VectorSearchFailed("store") from None
            conversation = self._conversations.get(conversation_id) or _Conversation(digests)
            self._conversations.put(conversation_id, conversation)
        return conversation

    def _dropped(self, conversation_id: str, conversation: _Conversation) -> None:
        """A conversation left the cache (its bounds, or ``forget``): its waiting pages are no longer tracked."""
        self.backlog.forget(conversation_id)
        if conversation.backlog_task is not None:
            conversation.backlog_task.cancel()

    async def _store(
        self,
        tenant: str,
        conversation_id: str,
        conversation: _Conversation,
        pages: list[tuple[str, str]],
        vectors: list[list[float]],
    ) -> None:
        rows = [(number, text_digest(text), vector) for (number, text), vector in zip(pages, vectors, strict=True)]
        try:
            await self.store.put_page_vectors(tenant, conversation_id, self.embedder.model_name, rows)
        except Exception:
            log.exception("could not store page vectors")  # they stay pending: tried again next search
            return
        done = []
        for (number, text), (_, digest, vector) in zip(pages, rows, strict=True):
            if conversation.pending.get(number) == text:
                del conversation.pending[number]
                done.append(number)
            conversation.digests[number] = digest
            self._by_digest.put(digest, vector)
        self.backlog.embedded(conversation_id, done)
        conversation.version = next(_DIGEST_VERSIONS)
        local = self._local.get(conversation_id)
        if local is None and len(conversation.digests) == len(rows):  # every vector of it is here: kept locally
            local = _LocalVectors()
        if local is not None:
            local.add(rows)
            self._local.put(conversation_id, local)  # measured again (may drop it: the store serves then)
        await self._ensure_index()

    async def _ensure_index(self) -> None:
        dim = self.embedder.dimension
        if not self.create_index or dim is None or dim in self._indexed_dims:
            return
        self._indexed_dims.add(dim)
        try:
            await self.store.ensure_vector_index(dim)
        except Exception:  # the search works without it (exact scan of the conversation)
            log.exception("could not create the HNSW index for dimension %d", dim)

    def _start_backlog(self, tenant: str, conversation_id: str, conversation: _Conversation) -> None:
        if conversation.backlog_task is not None and not conversation.backlog_task.done():
            return
        task = asyncio.create_task(self._embed_backlog(tenant, conversation_id, conversation))
        conversation.backlog_task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def mark_busy(self) -> None:
        """A turn started: background embedding waits for a quiet moment (at most ``max_lag_s`` per page)."""
        self.backlog.mark_busy()

    async def _embed_backlog(self, tenant: str, conversation_id: str, conversation: _Conversation) -> None:
        batch = max(1, self.inline_pages or 8)
        while conversation.pending:
            await self.backlog.wait_turn(conversation_id)
            pages = list(conversation.pending.items())[:batch]
            known = [self._by_digest.get(text_digest(text)) for _, text in pages]
            missing = [text for (_, text), vector in zip(pages, known, strict=True) if vector is None]
            got = await self.embedder.embed(missing) if missing else []
            if got is None:
                return  # still pending: the next search tries again
            fresh = iter(got)
            vectors = [vector if vector is not None else next(fresh) for vector in known]
            before = len(conversation.pending)
            await self._store(tenant, conversation_id, conversation, pages, vectors)
            if len(conversation.pending) >= before:
                return  # the store refused them: no busy loop

    async def drain(self) -> None:
        """Wait for background embedding (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Stop background embedding and close the embedder's connections."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        close = getattr(self.embedder, "close", None)
        if close is not None:
            await close()

    def forget(self, conversation_id: str) -> None:
        self._arrived.pop(conversation_id)
        self._local.pop(conversation_id)
        self.backlog.forget(conversation_id)
        self._conversations.pop(conversation_id)  # its backlog task cancelled (_dropped)
