"""When background page embedding runs, and how far behind it is.

Pages archived by a turn are embedded later, in a low-priority worker thread, once no turn has started for
``quiet_s`` (the forward pass shares the CPU and the interpreter lock with the turns). Under steady traffic no
such moment may come: a page that has waited ``max_lag_s`` since it was archived is embedded regardless, so the
lag is bounded by ``max_lag_s`` plus the time to embed the backlog ahead of it (the thread's low priority still
bounds its CPU share). A turn never waits on any of it.

``pages()`` and ``oldest_age_s()`` report the backlog (gauges read at scrape time); each page's time from
archive to stored vector is observed in ``lag`` (a histogram) when it is embedded.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any, Protocol

from memci_proxy.caches import BoundedLru

__all__ = ["EmbeddingBacklog"]
# Conversations with pages waiting, per process (the page vectors' conversations are bounded alike); a conversation
# dropped here keeps its pages waiting, only their lag is no longer observed.
MAX_CONVERSATIONS = 4096
MAX_BYTES = 16 * 2**20


def _waiting_bytes(conversation_id: str, waiting: dict[str, float]) -> int:
    return 128 + len(conversation_id) + sum(len(number) + 96 for number in waiting)


class _Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class EmbeddingBacklog:
    def __init__(self, quiet_s: float = 0.25, max_lag_s: float = 5.0, lag: _Observer | None = None,
                 max_conversations: int = MAX_CONVERSATIONS, max_bytes: int = MAX_BYTES) -> None:
        self.quiet_s = quiet_s
        self.max_lag_s = max_lag_s
        self.lag = lag
        self._last_busy = float("-inf")
        # conversation -> page number -> when it was archived
        self._since: BoundedLru[str, dict[str, float]] = BoundedLru(
            "embedding_backlog", max_conversations, max_bytes, size_of=_waiting_bytes)

    def mark_busy(self) -> None:
        """A turn started: background embedding waits for a quiet moment."""
        self._last_busy = time.monotonic()

    def arrived(self, conversation_id: str, numbers: Iterable[str]) -> None:
        """Pages waiting to be embedded (a page already waiting keeps its first arrival)."""
        now = time.monotonic()
        waiting = self._since.get(conversation_id) or {}
        for number in numbers:
            waiting.setdefault(number, now)
        self._since.put(conversation_id, waiting)

    def embedded(self, conversation_id: str, numbers: Iterable[str]) -> None:
        """Pages whose vectors are stored: their lag is observed."""
        waiting = self._since.get(conversation_id)
        if waiting is None:
            return
        now = time.monotonic()
        for number in numbers:
            since = waiting.pop(number, None)
            if since is not None and self.lag is not None:
                self.lag.observe(now - since)
        if not waiting:
            self._since.pop(conversation_id)
        else:
            self._since.resize(conversation_id)

    def forget(self, conversation_id: str) -> None:
        self._since.pop(conversation_id)

    def _waiting(self) -> list[dict[str, float]]:
        return [w for w in (self._since.peek(c) for c in self._since) if w]

    def forget_one(self, conversation_id: str, number: str) -> None:
        """A page no longer waiting, not embedded (dropped from a bounded backlog): no lag observed."""
        waiting = self._since.get(conversation_id)
        if waiting is not None:
            waiting.pop(number, None)
            if not waiting:
                del self._since[conversation_id]

    def pages(self) -> int:
        return sum(len(waiting) for waiting in self._waiting())

    def oldest_age_s(self) -> float:
        oldest = min((min(w.values()) for w in self._waiting()), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

    async def wait_turn(self, conversation_id: str) -> None:
        """Until no turn started for ``quiet_s``, or the conversation's oldest waiting page is ``max_lag_s`` old."""
        waiting = self._since.peek(conversation_id)
        deadline = (min(waiting.values()) if waiting else time.monotonic()) + self.max_lag_s
        while True:
            now = time.monotonic()
            idle = now - self._last_busy
            if idle >= self.quiet_s or now >= deadline:
                return
            await asyncio.sleep(min(self.quiet_s - idle, deadline - now) + 0.001)

    def expose(self, pages_gauge: Any, age_gauge: Any) -> None:
        """Report the backlog through two Prometheus gauges, read at scrape time."""
        pages_gauge.set_function(self.pages)
        age_gauge.set_function(self.oldest_age_s)
