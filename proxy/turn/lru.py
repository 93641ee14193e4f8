"""A per-process LRU map bounded in entries, in bytes and (optionally) in idle time, reported with the
other per-process caches (``proxy.caches``: memci_cache_* by cache name)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from proxy.caches import CacheStats, register

K = TypeVar("K")
V = TypeVar("V")


class SizedLru(Generic[K, V]):
    """Least recently used entries go first when either bound is crossed. ``size_of`` tells a value's size in
    bytes (an estimate is fine: the bound is on memory, not exact). ``max_idle_s`` > 0: an entry not read or
    written for that long is dropped too (checked from the least recent end on each write, so the work stays
    proportional to what leaves). ``name``: reported as memci_cache_*{cache=name}."""

    def __init__(
        self, max_entries: int, max_bytes: int, size_of: Callable[[V], int], name: str = "", max_idle_s: float = 0.0
    ) -> None:
        self.max_entries = max(1, max_entries)
        self.max_bytes = max(1, max_bytes)
        self.max_idle_s = max(0.0, max_idle_s)
        self._size_of = size_of
        self._items: OrderedDict[K, tuple[V, int, float]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0
        if name:
            register(name, self)

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        if self.max_idle_s:
            self._items[key] = (item[0], item[1], time.monotonic())
        return item[0]

    def put(self, key: K, value: V, size: int | None = None) -> None:
        size = self._size_of(value) if size is None else size
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        now = time.monotonic() if self.max_idle_s else 0.0
        if size > self.max_bytes:
            self._expire(now)
            return  # larger than the whole cache: not kept
        self._items[key] = (value, size, now)
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            self._drop_oldest()
        self._expire(now)

    def _expire(self, now: float) -> None:
        if not self.max_idle_s:
            return
        horizon = now - self.max_idle_s
        items = self._items
        while items:
            first = next(iter(items.values()))
            if first[2] > horizon:
                return
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, (_, dropped, _) = self._items.popitem(last=False)
        self.bytes -= dropped
        self.evictions += 1

    def pop(self, key: K, default: V | None = None) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return default
        self.bytes -= item[1]
        return item[0]

    def cache_stats(self) -> CacheStats:
        return CacheStats(len(self._items), self.bytes, self.max_entries, self.max_bytes, self.evictions)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
