"""The full-text index of the pages a write before the upstream call stored without it (migration 0010).

An epoch stores the pages leaving the prompt before the request that omits them; their tsvector (jsonb_to_tsvector
over each page's messages, and its GIN entry) was the larger part of that write. Such a write now asks for
``index_behind``: the pages are stored, durable and readable, and their full-text index is made after the answer
(``soon``), in the background. A read of the database that must see it (``/memci/search``, through the service's
``flush``) waits for it (``wait``). Pages a stopped process left unindexed are indexed when the next one starts.

Only with ``page_fulltext`` on: nothing the proxy ranks with reads the index (recall, the push and ``/memci/search``
rank in process), so by default the store's sessions leave every page without it (``enabled`` False: nothing to do).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from memci_proxy.metrics import Metrics

log = logging.getLogger("memci.turn")


class IndexBehind:
    def __init__(self, repo: Any, metrics: Metrics, enabled: bool = True) -> None:
        self.repo = repo
        self.metrics = metrics
        self.wanted = enabled  # page_fulltext; off: the store's sessions leave pages unindexed, and so do its writes
        self.enabled = enabled and hasattr(repo, "index_pages")
        self._waiting: dict[str, tuple[str, set[str]]] = {}  # conversation -> (tenant, pages stored unindexed)
        self._running: dict[str, asyncio.Task[None]] = {}  # conversation -> its pages being indexed
        self._tasks: set[asyncio.Task[Any]] = set()

    def start(self) -> None:
        """The pages a stopped process left without their index, indexed in the background."""
        left = getattr(self.repo, "index_left_pages", None)
        if left is not None and self.enabled:
            self._spawn(self._left(left))

    def stored(self, tenant: str, conversation_id: str, numbers: Iterable[str]) -> None:
        """Pages stored by a write with ``index_behind`` (those leaving 'active' among them are unindexed)."""
        numbers = set(numbers)
        if numbers and self.enabled:
            self._waiting.setdefault(conversation_id, (tenant, set()))[1].update(numbers)

    def soon(self, conversation_id: str) -> None:
        """After the answer: the conversation's unindexed pages indexed in the background."""
        if conversation_id not in self._waiting or conversation_id in self._running:
            return
        tenant, numbers = self._waiting.pop(conversation_id)
        task = self._spawn(self._index(tenant, conversation_id, numbers))
        self._running[conversation_id] = task
        task.add_done_callback(lambda _: self._running.pop(conversation_id, None))

    async def wait(self, conversation_id: str) -> None:
        """Until the conversation's pages stored so far are indexed (a read of the database follows)."""
        for _ in range(2):  # the second pass: pages stored, or a failed index given back, meanwhile
            self.soon(conversation_id)
            running = self._running.get(conversation_id)
            if running is None:
                return
            await asyncio.shield(running)

    def forget(self, conversation_id: str) -> None:
        self._waiting.pop(conversation_id, None)

    async def close(self) -> None:
        for conversation_id in list(self._waiting):
            self.soon(conversation_id)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _index(self, tenant: str, conversation_id: str, numbers: set[str]) -> None:
        try:
            await self.repo.index_pages(tenant, conversation_id, sorted(numbers))
        except Exception as exc:  # the next epoch of the conversation tries them again
            log.warning("could not index %d archived pages of %s (%s)", len(numbers), conversation_id, exc)
            self.metrics.store_write_failures.labels("index").inc()
            self._waiting.setdefault(conversation_id, (tenant, set()))[1].update(numbers)

    async def _left(self, left: Any) -> None:
        try:
            indexed = await left()
            if indexed:
                log.info("indexed %d archived pages left unindexed by a stopped process", indexed)
        except Exception as exc:
            log.warning("could not index the archived pages left unindexed (%s)", exc)

    def _spawn(self, work: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
