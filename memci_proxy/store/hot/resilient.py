"""HotState that survives Redis outages (DESIGN 9: "Redis down -> read state from Postgres, lock
in-process, say so in metrics").

Every call goes to Redis unless Redis failed within the last ``retry_after_s``; then it goes to
an in-process fallback instead: snapshots and fingerprints read as misses there at first (the
caller rebuilds from PostgreSQL) and the session lock becomes a per-process lock. ``degraded``
tells metrics and /health which mode is on.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar

from redis.exceptions import RedisError

from memci_proxy.store.hot.memory import InProcessHotState
from memci_proxy.store.hot.redis import RedisHotState
from memci_proxy.store.ports import LockTimeout

logger = logging.getLogger("memci.store")

T = TypeVar("T")

OUTAGE_ERRORS = (RedisError, OSError)


class ResilientHotState:
    """Implements memci_proxy.store.ports.HotState: Redis first, in-process while Redis is down."""

    kind = "redis"

    def __init__(
        self,
        primary: RedisHotState,
        fallback: InProcessHotState | None = None,
        retry_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary = primary
        self.fallback = fallback or InProcessHotState()
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._down_since: float | None = None
        self.outages = 0  # times Redis was found down (a counter for metrics)

    @property
    def degraded(self) -> bool:
        return self._down_since is not None

    def _redis_usable(self) -> bool:
        return self._down_since is None or self._clock() - self._down_since >= self.retry_after_s

    def _mark_down(self, error: BaseException) -> None:
        if self._down_since is None:
            self.outages += 1
            logger.warning("Redis unreachable (%s): hot state and locks in-process until it is back", error)
        self._down_since = self._clock()

    def _mark_up(self) -> None:
        if self._down_since is not None:
            logger.warning("Redis reachable again: hot state and locks back on Redis")
            self._down_since = None

    async def _call(
        self, on_redis: Callable[[], Awaitable[T]], on_fallback: Callable[[], Awaitable[T]]
    ) -> T:
        if self._redis_usable():
            try:
                result = await on_redis()
            except OUTAGE_ERRORS as error:
                self._mark_down(error)
            else:
                self._mark_up()
                return result
        return await on_fallback()

    # --- snapshots and fingerprints ------------------------------------------------------------
    async def get_snapshot(self, conversation_id: str, newer_than: int = -1) -> tuple[bytes, int] | None:
        """The newer of Redis's and the fallback's: a snapshot written here during an outage is
        newer than the one Redis kept (PostgreSQL's StaleState check guards the other replicas)."""
        local = await self.fallback.get_snapshot(conversation_id, newer_than)
        shared = await self._call(lambda: self.primary.get_snapshot(conversation_id, newer_than), _nothing)
        if local is None or (shared is not None and shared[1] >= local[1]):
            return shared
        return local

    async def put_snapshot(self, conversation_id: str, snapshot: bytes, version: int, ttl_s: float) -> None:
        async def on_redis() -> None:
            await self.primary.put_snapshot(conversation_id, snapshot, version, ttl_s)
            self.fallback.forget_snapshot(conversation_id)  # Redis has the newest now

        await self._call(on_redis, lambda: self.fallback.put_snapshot(conversation_id, snapshot, version, ttl_s))

    async def get_fingerprint(self, tenant: str, chain_hash: str) -> tuple[str, int] | None:
        return await self._call(
            lambda: self.primary.get_fingerprint(tenant, chain_hash),
            lambda: self.fallback.get_fingerprint(tenant, chain_hash),
        )

    async def put_fingerprints(self, tenant: str, items: list[tuple[str, str, int]], ttl_s: float) -> None:
        await self._call(
            lambda: self.primary.put_fingerprints(tenant, items, ttl_s),
            lambda: self.fallback.put_fingerprints(tenant, items, ttl_s),
        )

    async def delete_conversation(self, conversation_id: str) -> None:
        await self.fallback.delete_conversation(conversation_id)
        await self._call(lambda: self.primary.delete_conversation(conversation_id), _nothing)

    # --- session lock ---------------------------------------------------------------------------
    def lock(
        self, conversation_id: str, timeout_s: float = 30.0, lease_s: float = 60.0
    ) -> AbstractAsyncContextManager[None]:
        return self._lock(conversation_id, timeout_s, lease_s)

    @contextlib.asynccontextmanager
    async def _lock(self, conversation_id: str, timeout_s: float, lease_s: float) -> AsyncIterator[None]:
        """The in-process lock first (queues this replica's own requests, and covers the moments
        Redis goes down or comes back), then the Redis lease when Redis is usable."""
        deadline = self._clock() + timeout_s
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.fallback.lock(conversation_id, timeout_s, lease_s))
            if self._redis_usable():
                remaining = max(deadline - self._clock(), 0.0)
                try:
                    await stack.enter_async_context(self.primary.lock(conversation_id, remaining, lease_s))
                except LockTimeout:
                    raise
                except OUTAGE_ERRORS as error:
                    self._mark_down(error)
                else:
                    self._mark_up()
            yield

    # --- lifecycle -----------------------------------------------------------------------------
    async def ping(self) -> bool:
        """True when Redis answers (the hot state works in-process either way)."""
        alive = await self.primary.ping()
        if alive:
            self._mark_up()
        return alive

    async def close(self) -> None:
        await self.primary.close()
        await self.fallback.close()


async def _nothing() -> None:
    return None
