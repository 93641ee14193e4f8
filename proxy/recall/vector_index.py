"""The vector half of the recall search: embed archived pages, keep their vectors in PostgreSQL, find the
nearest pages of a conversation to a query.

When pages are embedded: at the first search after they are archived, in the same batched request as
the query (one round trip: the query must be embedded at that moment anyway, and a conversation archives
a page or a few per epoch). Vectors are stored with a digest of the embedded text, so a restarted proxy
re-embeds nothing that is already stored and a page whose text changed is embedded again. A backlog larger
than ``inline_pages`` (embeddings newly configured on a long conversation) is embedded by a background
task while the search goes on with the vectors it has (lexical ranking carries the rest).

Pages that could not be embedded (endpoint failing) stay pending and are tried again at the next search.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import xxhash

from proxy.caches import BoundedLru, CacheStats, register
from proxy.store.ports import PageVectorStore

log = logging.getLogger("memci.recall")
ARRIVED_MAX_BYTES = 64 * 2**20  # page texts waiting to be embedded, per process

__all__ = ["Embedder", "PageVectors", "VectorSearchFailed", "build_page_vectors", "text_digest"]


class Embedder(Protocol):
    """What PageVectors needs of an embeddings client (proxy.recall.embeddings.EmbeddingsClient)."""

    dimension: int | None
    last_failure: str | None

    @property
    def model_name(self) -> str: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]] | None: ...


def text_digest(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogatepass"))


class VectorSearchFailed(Exception):
    """The query could not be embedded or searched; ``reason`` labels the fallback metric."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Conversation:
    __slots__ = ("digests", "pending", "backlog_task")

    def __init__(self, digests: dict[str, str]) -> None:
        self.digests = digests  # page number -> digest of the stored vector's text
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
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.inline_pages = max(0, inline_pages)
        self.create_index = create_index
        self.capacity = capacity
        self._conversations: OrderedDict[str, _Conversation] = OrderedDict()
        self._indexed_dims: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # conversation -> pages not yet compared with the store: bounded like the conversations and in bytes (a
        # conversation dropped here keeps its lexical index; its new pages are embedded when next re-indexed)
        self._arrived: BoundedLru[str, dict[str, str]] = BoundedLru(
            "page_vectors_arrived", capacity, ARRIVED_MAX_BYTES,
            size_of=lambda k, pages: 64 + len(k) + sum(len(n) + len(t) + 64 for n, t in pages.items()))
        register("page_vectors_conversations", self)  # reports through cache_stats

    def remember(self, conversation_id: str, pages: dict[str, str]) -> None:
        """Pages (number -> text) that entered the lexical index: embedded at the next ``nearest`` call."""
        if pages:
            waiting = self._arrived.get(conversation_id) or {}
            waiting.update(pages)
            self._arrived.put(conversation_id, waiting)

    async def nearest(self, tenant: str, conversation_id: str, query: str, k: int) -> list[tuple[str, float]]:
        """(page number, cosine) of the conversation's pages nearest to ``query``, best first, after embedding
        the pages remembered since the last call. Raises VectorSearchFailed (the caller goes lexical)."""
        conversation = await self._conversation(tenant, conversation_id)
        for number, text in (self._arrived.pop(conversation_id) or {}).items():
            if conversation.digests.get(number) != text_digest(text):
                conversation.pending[number] = text
            else:
                conversation.pending.pop(number, None)
        inline = list(conversation.pending.items())[: self.inline_pages]
        vectors = await self.embedder.embed([query, *(text for _, text in inline)])
        if vectors is None:
            raise VectorSearchFailed(self.embedder.last_failure or "embeddings")
        query_vector, page_vectors = vectors[0], vectors[1:]
        if inline:
            await self._store(tenant, conversation_id, conversation, inline, page_vectors)
        if conversation.pending:
            self._start_backlog(tenant, conversation_id, conversation)
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
            conversation = self._conversations.setdefault(conversation_id, _Conversation(digests))
        self._conversations.move_to_end(conversation_id)
        while len(self._conversations) > self.capacity:
            _, dropped = self._conversations.popitem(last=False)
            if dropped.backlog_task is not None:
                dropped.backlog_task.cancel()
        return conversation

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
        for (number, text), (_, digest, _) in zip(pages, rows, strict=True):
            if conversation.pending.get(number) == text:
                del conversation.pending[number]
            conversation.digests[number] = digest
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

    async def _embed_backlog(self, tenant: str, conversation_id: str, conversation: _Conversation) -> None:
        batch = max(1, self.inline_pages or 32)
        while conversation.pending:
            pages = list(conversation.pending.items())[:batch]
            vectors = await self.embedder.embed([text for _, text in pages])
            if vectors is None:
                return  # still pending: the next search tries again
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

    def cache_stats(self) -> CacheStats:
        return CacheStats(len(self._conversations), -1, self.capacity, 0, 0)

    def forget(self, conversation_id: str) -> None:
        self._arrived.pop(conversation_id)
        dropped = self._conversations.pop(conversation_id, None)
        if dropped is not None and dropped.backlog_task is not None:
            dropped.backlog_task.cancel()


def build_page_vectors(
    store: PageVectorStore,
    embeddings_url: str,
    upstream_url: str = "",
    model: str = "",
    api_key: str = "",
    timeout_s: float = 5.0,
    inline_pages: int = 32,
) -> PageVectors | None:
    """The vector half of the search, or None (lexical only) when ``embeddings_url`` is empty.

    ``embeddings_url``: an OpenAI base URL serving ``/embeddings``, or "upstream" for the upstream's own
    (the first of ``upstream_url``'s comma-separated URLs)."""
    from proxy.recall.embeddings import EmbeddingsClient

    url = embeddings_url.strip()
    if url.lower() == "upstream":
        url = upstream_url.split(",")[0].strip()
    if not url:
        return None
    return PageVectors(store, EmbeddingsClient(url, model=model, timeout_s=timeout_s, api_key=api_key),
                       inline_pages=inline_pages)
