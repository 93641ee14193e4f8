"""A packaged embedding model (memci_proxy.recall.vectors.packaged_models: ``use-multilingual-v3`` by default) behind
the protocol of the HTTP client (memci_proxy.recall.vectors.endpoint.EmbeddingsClient): ``await embed(texts)`` gives one
L2-normalised vector per text or ``None`` with ``last_failure`` set, never raises. The model is loaded once
per process, in a worker thread (``warm``); the forward pass runs in worker threads too, one for pages (in
the background) and one for queries, so that a page backlog never delays a recall (a model cheap enough,
``inline_query``, embeds a query on the caller's thread instead). With ``page_process`` the pages go to a process
of their own (memci_proxy.recall.vectors.page_process): their forward pass no longer holds this process's interpreter
lock.

Long texts are cut into chunks of at most ``max_chars`` characters at word boundaries (the encoder averages
over its tokens, so a very long input blurs what it is about; at most ``MAX_CHUNKS``, spread over the text); a
text's vector is the normalised mean of its chunks' vectors. An empty text (an image-only page without a description) gets a zero vector: its cosine
with any query is 0, under ``recall_min_cosine``, so it never ranks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.recall.vectors.chunks import CHUNK_CHARS, chunk_text
from memci_proxy.recall.vectors.packaged_models import (DEFAULT_MODEL, Encode, PackagedModel, packaged_model,
                                                        shared_encoder)
from memci_proxy.recall.vectors.page_process import Embedded, PageProcess, embed_texts, yield_cpu

log = logging.getLogger("memci.recall")

__all__ = ["LocalEmbedder", "chunk_text"]


def _lower_priority() -> None:
    """The page-embedding thread yields the CPU to the event loop's (Linux: a thread has its own policy). Never the
    process's main thread: where threads are green (gevent's patching), a "thread" runs on it."""
    thread = threading.get_native_id()
    if thread != os.getpid():
        yield_cpu(thread)


class LocalEmbedder:
    """``await embed(texts)`` (pages, background thread) and ``await embed_query(text)`` (recall path)."""

    def __init__(
        self,
        model: str | PackagedModel = DEFAULT_MODEL,
        weights_path: str = "",
        max_chars: int = CHUNK_CHARS,
        loader: Callable[[str], Encode] | None = None,
        query_cache_entries: int = 512,
        metrics: Any = None,
        page_process: bool = False,
    ) -> None:
        self.model = packaged_model(model) if isinstance(model, str) else model
        self.weights_path = weights_path
        self.max_chars = max(16, max_chars)
        self.dimension: int | None = None
        self.last_failure: str | None = None
        self.metrics = metrics
        self._loader = loader or (lambda path: shared_encoder(self.model, path))
        self._encode: Encode | None = None
        self._failed = False
        self._lock = threading.Lock()
        self._pages = ThreadPoolExecutor(1, "memci-embed-pages", initializer=_lower_priority)
        # pages in a process of their own (memci_proxy.recall.vectors.page_process): the packaged model only (a loader
        # passed in is this process's own), and only where asked (the proxy's settings; tests keep threads)
        self._process = (PageProcess(self.model.name, weights_path, self.max_chars)
                         if page_process and loader is None else None)
        self._queries = ThreadPoolExecutor(1, "memci-embed-query")
        self._query_vectors: BoundedLru[str, list[float]] = BoundedLru(
            "embedding_queries", query_cache_entries, 8 * 2**20, size_of=lambda k, v: 64 + len(k) + 8 * len(v))
        # queries whose forward pass is under way: text -> (the pass, the text's place in it)
        self._query_passes: dict[str, tuple[asyncio.Future[list[list[float]] | None], int]] = {}

    @property
    def model_name(self) -> str:
        return self.model.name

    @property
    def ready(self) -> bool:
        return self._encode is not None

    @property
    def loading(self) -> bool:
        """The model is neither loaded nor failed (a search meanwhile is lexical)."""
        return self._encode is None and not self._failed

    def status(self) -> dict[str, object]:
        """For /ready: ok once the model is loaded or has failed for good (search then lexical, not waiting)."""
        state = "loaded" if self.ready else "loading" if self.loading else f"failed ({self.last_failure}): lexical search"
        return {"ok": not self.loading, "model": self.model.name, "state": state}

    def warm(self) -> None:
        """Load the model in the background (a search meanwhile is lexical, counted as 'loading')."""
        self._pages.submit(self._model)
        if self._process is not None:
            self._process.warm()

    def _model(self) -> Encode | None:
        if self._encode is not None:
            return self._encode
        with self._lock:
            if self._encode is None and not self._failed:
                try:
                    self._encode = self._loader(self.weights_path)
                    self.dimension = self.model.dimension
                    log.info("embedding model %s loaded", self.model.name)
                except (ImportError, FileNotFoundError) as exc:
                    self._fail_load("model_absent", exc)
                except Exception as exc:  # unreadable weights, a broken install
                    self._fail_load("model_error", exc)
            return self._encode

    def _fail_load(self, reason: str, exc: BaseException) -> None:
        self._failed = True
        self.last_failure = reason
        log.warning("embedding model %s unavailable (%s: %r): recall search is lexical only",
                    self.model.name, reason, exc)

    def _embed_now(self, texts: Sequence[str]) -> list[list[float]] | None:
        encode = self._model()
        if encode is None:
            return None
        return self._counted(embed_texts(encode, texts, self.max_chars, self.model.dimension))

    def _counted(self, done: Embedded) -> list[list[float]] | None:
        for outcome, n in done.outcomes.items():
            self._count(outcome, n)
        if done.vectors is None:
            if self.last_failure != "model_error":
                log.warning("embedding model %s failed (%s): recall search is lexical only meanwhile",
                            self.model.name, done.error)
            self.last_failure = "model_error"
            return None
        self.last_failure = None
        return done.vectors

    def _count(self, outcome: str, n: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.embedded_texts.labels(outcome).inc(n)

    async def embed(self, texts: Sequence[str]) -> list[list[float]] | None:
        """Pages, in the background: in the page process when there is one (the model loaded in this process too,
        for queries), else on the page thread."""
        if not texts:
            return []
        if self._process is not None and self._encode is not None:
            done = await self._process.embed(list(texts))
            if done is not None:
                return self._counted(done)
        return await asyncio.get_running_loop().run_in_executor(self._pages, self._embed_now, list(texts))

    async def embed_search(self, texts: Sequence[str]) -> list[list[float]] | None:
        """Pages a search waits for (its candidates): on the query thread, at normal priority; None while the model
        loads or when it failed."""
        if self._encode is None:
            if not self._failed:
                self.warm()
                self.last_failure = "loading"
            return None
        if not texts:
            return []
        return await asyncio.get_running_loop().run_in_executor(self._queries, self._embed_now, list(texts))

    def embed_queries_soon(self, texts: Sequence[str]) -> None:
        """Start one forward pass for those of ``texts`` neither cached nor under way (a turn that will search for
        several queries: one pass costs little more than one query's; started before the search, it runs while the
        turn does other work); ``embed_query`` of any of them waits for it."""
        if self._encode is None or self.model.inline_query:
            return
        wanted = [t for t in dict.fromkeys(texts)
                  if t and t not in self._query_passes and self._query_vectors.peek(t) is None]
        if not wanted:
            return
        running = asyncio.get_running_loop().run_in_executor(self._queries, self._embed_now, wanted)
        for place, text in enumerate(wanted):
            self._query_passes[text] = (running, place)

        def landed(done: asyncio.Future[list[list[float]] | None]) -> None:
            vectors = None if done.cancelled() or done.exception() is not None else done.result()
            for place, text in enumerate(wanted):
                if self._query_passes.get(text, (None, 0))[0] is done:
                    del self._query_passes[text]
                if vectors is not None:
                    self._query_vectors.put(text, vectors[place])

        running.add_done_callback(landed)

    async def embed_query(self, text: str) -> list[float] | None:
        """The query's vector (cached by text); None while the model loads or when it failed."""
        cached = self._query_vectors.get(text)
        if cached is not None:
            return cached
        under_way = self._query_passes.get(text)
        if under_way is not None:  # in a pass started for several queries
            vectors = await asyncio.shield(under_way[0])
            return vectors[under_way[1]] if vectors is not None else None
        if self._encode is None:
            if self._failed:
                return None
            self.warm()
            self.last_failure = "loading"
            return None
        if self.model.inline_query:
            got = self._embed_now([text])
        else:
            got = await asyncio.get_running_loop().run_in_executor(self._queries, self._embed_now, [text])
        if got is None:
            return None
        self._query_vectors.put(text, got[0])
        return got[0]

    async def close(self) -> None:
        self._pages.shutdown(wait=False, cancel_futures=True)
        self._queries.shutdown(wait=False, cancel_futures=True)
        if self._process is not None:
            self._process.close()
