"""In-process HotState: one replica only (no REDIS_URL).

Snapshots and fingerprints in LRU maps bounded in entries and bytes, with lazily honoured TTLs (both are
caches: PostgreSQL holds the truth); the session lock is a lease in a dict, and waiters wake on release
instead of polling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

from memci_proxy.caches import BoundedLru
from memci_proxy.store.hot.locking import hold_lease

K = TypeVar("K")
V = TypeVar("V")
DEFAULT_SNAPSHOT_BYTES = 256 * 2**20


class _TtlLru(Generic[K, V]):
    """A bounded LRU map (entries and bytes, see memci_proxy.caches.BoundedLru) whose items expire (checked when read)."""

    def __init__(
        self, name: str, max_items: int, clock: Callable[[], float],
        on_drop: Callable[[K, V], None] | None = None, max_bytes: int = 0,
        size_of: Callable[[K, V], int] | None = None,
    ) -> None:
        self._clock = clock
        measure = None if size_of is None else (lambda k, item: size_of(k, item[0]))
        drop = None if on_drop is None else (lambda k, item: on_drop(k, item[0]))
        self._items: BoundedLru[K, tuple[V, float]] = BoundedLru(name, max_items, max_bytes, measure, drop)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        value, expires_at = item
        if expires_at <= self._clock():
            self._items.pop(key)
            return None
        return value

    def put(self, key: K, value: V, ttl_s: float) -> None:
        self._items.put(key, (value, self._clock() + ttl_s))

    def pop(self, key: K) -> None:
        self._items.pop(key)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._items.bytes


@dataclass
class _Lease:
    token: str
    expires_at: float


class InProcessHotState:
    """Implements memci_proxy.store.ports.HotState inside one process."""

    kind = "in-process"

    def __init__(
        self,
        max_conversations: int = 10_000,
        max_fingerprints: int = 200_000,
        clock: Callable[[], float] = time.monotonic,
        max_snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES,
    ) -> None:
        self._clock = clock
        self._snapshots: _TtlLru[str, tuple[bytes, int]] = _TtlLru(
            "hot_snapshots", max_conversations, clock, max_bytes=max_snapshot_bytes,
            size_of=lambda key, value: len(key) + len(value[0]) + 96,
        )
        # ~250 bytes an item (two tuples, three short strings): 200,000 items ~ 50 MB at most.
        self._fingerprints: _TtlLru[tuple[str, str], tuple[str, int]] = _TtlLru(
            "hot_fingerprints", max_fingerprints, clock, on_drop=self._unindex_fingerprint
        )
        self._fingerprints_of: dict[str, set[tuple[str, str]]] = {}  # conversation -> its cached keys
        self._leases: dict[str, _Lease] = {}
        self._released: dict[str, asyncio.Event] = {}

    # --- snapshots ---------------------------------------------------------------------------
    async def get_snapshot(self, conversation_id: str, newer_than: int = -1) -> tuple[bytes, int] | None:
        found = self._snapshots.get(conversation_id)
        return found if found is not None and found[1] > newer_than else None

    async def put_snapshot(self, conversation_id: str, snapshot: bytes, version: int, ttl_s: float) -> None:
        current = self._snapshots.get(conversation_id)
        if current is not None and current[1] > version:
            return
        self._snapshots.put(conversation_id, (snapshot, version), ttl_s)

    def forget_snapshot(self, conversation_id: str) -> None:
        self._snapshots.pop(conversation_id)

    # --- fingerprints ------------------------------------------------------------------------
    async def get_fingerprint(self, tenant: str, chain_hash: str) -> tuple[str, int] | None:
        return self._fingerprints.get((tenant, chain_hash))

    async def put_fingerprints(self, tenant: str, items: list[tuple[str, str, int]], ttl_s: float) -> None:
        for chain_hash, conversation_id, length in items:
            key = (tenant, chain_hash)
            self._fingerprints.pop(key)  # unindexes a previous owner
            self._fingerprints.put(key, (conversation_id, length), ttl_s)
            self._fingerprints_of.setdefault(conversation_id, set()).add(key)

    def _unindex_fingerprint(self, key: tuple[str, str], value: tuple[str, int]) -> None:
        keys = self._fingerprints_of.get(value[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._fingerprints_of[value[0]]

    async def delete_conversation(self, conversation_id: str) -> None:
        self._snapshots.pop(conversation_id)
        for key in list(self._fingerprints_of.get(conversation_id, ())):
            self._fingerprints.pop(key)
        self._fingerprints_of.pop(conversation_id, None)

    # --- session lock ------------------------------------------------------------------------
    def lock(
        self, conversation_id: str, timeout_s: float = 30.0, lease_s: float = 60.0
    ) -> AbstractAsyncContextManager[None]:
        return hold_lease(self, conversation_id, timeout_s, lease_s)

    async def try_acquire(self, conversation_id: str, token: str, lease_s: float) -> bool:
        now = self._clock()
        lease = self._leases.get(conversation_id)
        if lease is not None and lease.expires_at > now:
            return False
        self._leases[conversation_id] = _Lease(token, now + lease_s)
        return True

    async def renew(self, conversation_id: str, token: str, lease_s: float) -> bool:
        lease = self._leases.get(conversation_id)
        if lease is None or lease.token != token or lease.expires_at <= self._clock():
            return False
        lease.expires_at = self._clock() + lease_s
        return True

    async def release(self, conversation_id: str, token: str) -> bool:
        return self.release_now(conversation_id, token)

    def release_now(self, conversation_id: str, token: str) -> bool:
        """``release`` without a wait (hold_lease calls it directly: no task to shield)."""
        lease = self._leases.get(conversation_id)
        if lease is None or lease.token != token:
            return False
        del self._leases[conversation_id]
        released = self._released.pop(conversation_id, None)
        if released is not None:
            released.set()
        return True

    async def wait_for_release(self, conversation_id: str, backoff_s: float, remaining_s: float) -> None:
        lease = self._leases.get(conversation_id)
        if lease is None:
            return
        # Wake at release, or when the holder's lease runs out (a holder that never released).
        until_expiry = max(lease.expires_at - self._clock(), 0.0) + 0.001
        released = self._released.setdefault(conversation_id, asyncio.Event())
        try:
            await asyncio.wait_for(released.wait(), timeout=min(remaining_s, until_expiry))
        except TimeoutError:
            pass

    # --- lifecycle ---------------------------------------------------------------------------
    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        self._leases.clear()
        for event in self._released.values():
            event.set()
        self._released.clear()
