"""Page views waiting for their vector, embedded off the request path by one background task.

A search never embeds a page (memci_proxy.recall.vectors.candidates): the views of the pages a turn archived are queued
here after that turn (``later``), and the views of a search's candidates that had no vector yet are queued first
(``soon``: a search that found them is likely to be asked again). One task embeds them one view at a time through the
embedder's page thread (low priority: memci_proxy.recall.vectors.local_embedder), a few at a time (``batch_chars``: one
request to an embeddings server, a short forward pass of the packaged model), once no turn has started for ``quiet_s``
or once the oldest view has waited ``max_lag_s`` (memci_proxy.recall.vectors.backlog), and hands each vector to
``keep``.

Bounded: at most ``max_views`` views wait (each text already cut to a page sample); past it the oldest archived
views are dropped first (a dropped page is queued again when a search finds it). The backlog is in the metrics
(``memci_embedding_backlog_pages``, ``memci_embedding_backlog_age_seconds``, ``memci_page_embedding_lag_seconds``;
``memci_search_pages_embedded_total`` counts the views embedded).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from memci_proxy.recall.vectors.backlog import EmbeddingBacklog

log = logging.getLogger("memci.recall")

__all__ = ["BackgroundEmbedding", "MAX_VIEWS"]

MAX_VIEWS = 4096
BATCH_CHARS = 4800  # of view text per call of the model (about four of the packaged model's inputs)
_ALL = ""  # the backlog's one key: views are keyed by digest, whatever their conversation


class BackgroundEmbedding:
    def __init__(self, embed: Callable[[list[str]], Awaitable[Sequence[Sequence[float]] | None]],
                 keep: Callable[[str, Sequence[float]], None], known: Callable[[str], bool],
                 max_views: int = MAX_VIEWS, quiet_s: float = 0.25, max_lag_s: float = 5.0, metrics: Any = None,
                 batch_chars: int = BATCH_CHARS) -> None:
        self.embed = embed
        self.batch_chars = batch_chars
        self.keep = keep
        self.known = known
        self.max_views = max(1, max_views)
        self.metrics = metrics
        self.backlog = EmbeddingBacklog(quiet_s=quiet_s, max_lag_s=max_lag_s,
                                        lag=getattr(metrics, "page_embedding_lag", None))
        if metrics is not None:
            self.backlog.expose(metrics.embedding_backlog_pages, metrics.embedding_backlog_age)
        self._soon: OrderedDict[str, str] = OrderedDict()  # digest -> text, a search's candidates
        self._later: OrderedDict[str, str] = OrderedDict()  # digest -> text, archived pages
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._soon) + len(self._later)

    def submit(self, views: Iterable[tuple[str, str]], soon: bool = False) -> None:
        """Views (digest of the text, text) to embed; ``soon``: before the archived pages' views."""
        if self._closed:
            return
        queue = self._soon if soon else self._later
        added = []
        for digest, text in views:
            if digest in self._soon or self.known(digest):
                continue
            if soon:
                self._later.pop(digest, None)
            elif digest in self._later:
                continue
            queue[digest] = text
            added.append(digest)
        self.backlog.arrived(_ALL, added)
        while len(self) > self.max_views:
            digest, _ = (self._later or self._soon).popitem(last=False)
            self.backlog.forget_one(_ALL, digest)
            self.dropped += 1
        if len(self) and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run())

    def mark_busy(self) -> None:
        self.backlog.mark_busy()

    async def _run(self) -> None:
        while len(self):
            await self.backlog.wait_turn(_ALL)
            if not len(self):
                return
            batch = self._take_batch()
            if not batch:
                continue
            try:
                got = await self.embed([text for _, text in batch])
            except Exception:
                log.exception("background embedding failed")
                got = None
            if not got or len(got) != len(batch):
                # the model failed: these pages stay lexical until a search finds them again
                for digest, _ in batch:
                    self.backlog.forget_one(_ALL, digest)
                continue
            for (digest, _), vector in zip(batch, got, strict=True):
                self.keep(digest, vector)
            self.backlog.embedded(_ALL, [digest for digest, _ in batch])
            if self.metrics is not None:
                self.metrics.search_pages_embedded.inc(len(batch))

    def _take_batch(self) -> list[tuple[str, str]]:
        """The next views to embed (a search's candidates first), up to ``batch_chars`` of text (one at least)."""
        batch: list[tuple[str, str]] = []
        room = self.batch_chars
        while len(self) and room > 0:
            queue = self._soon or self._later
            digest, text = next(iter(queue.items()))
            if batch and len(text) > room:
                break
            queue.popitem(last=False)
            if self.known(digest):
                self.backlog.embedded(_ALL, [digest])
                continue
            batch.append((digest, text))
            room -= len(text)
        return batch

    async def drain(self) -> None:
        """Until every waiting view is embedded (tests, evaluations)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
