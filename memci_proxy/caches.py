"""Bounded per-process caches and their metrics.

Every cache a proxy process keeps (hot state without Redis, search indexes, image descriptions, summaries,
limiter buckets, memos) is bounded in entries and, where its values can be large, in bytes, so that a process
left running for weeks holds a flat amount of memory. ``BoundedLru`` is the one LRU map they share; caches of
another shape (``functools.lru_cache`` memos, module-level maps) report through ``register``.

``CacheCollector`` (registered by ``memci_proxy.metrics.Metrics``) exports, per cache name:
``memci_cache_entries``, ``memci_cache_bytes`` (-1: not measured), ``memci_cache_max_entries``,
``memci_cache_max_bytes`` (0: no byte bound) and ``memci_cache_evictions_total``.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class CacheStats:
    entries: int
    bytes: int  # -1 when the cache does not measure its size
    max_entries: int
    max_bytes: int  # 0: bounded in entries only
    evictions: int


def size_of_text(value: Any) -> int:
    """Bytes of a str/bytes value (and of the str/bytes items of a tuple), plus a fixed overhead."""
    if isinstance(value, (bytes, bytearray)):
        return len(value) + 64
    if isinstance(value, str):
        return len(value) + 64
    if isinstance(value, tuple):
        return 64 + sum(size_of_text(v) for v in value)
    return sys.getsizeof(value)


class BoundedLru(Generic[K, V]):
    """An LRU map bounded in entries and (optionally) in bytes, as measured by ``size_of`` per item, and in idle
    time: with ``max_idle_s`` > 0 an item not read or written for that long leaves too (checked from the least
    recent end on each write, so the work stays proportional to what leaves).

    An item larger than the whole byte bound is not kept. ``on_drop(key, value)`` runs for every item that
    leaves by eviction or ``pop`` (not by ``clear``)."""

    def __init__(
        self,
        name: str,
        max_entries: int,
        max_bytes: int = 0,
        size_of: Callable[[K, V], int] | None = None,
        on_drop: Callable[[K, V], None] | None = None,
        register_stats: bool = True,
        max_idle_s: float = 0.0,
    ) -> None:
        self.name = name
        self.max_entries = max(1, int(max_entries))
        self.max_bytes = max(0, int(max_bytes))
        self.max_idle_s = max(0.0, float(max_idle_s))
        self._size_of = size_of or (lambda _k, v: size_of_text(v))
        self._on_drop = on_drop
        self._items: OrderedDict[K, tuple[V, int, float]] = OrderedDict()  # value, size, last touched
        self.bytes = 0
        self.evictions = 0
        if register_stats:
            register(name, self)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def peek(self, key: K) -> V | None:
        """The value without refreshing its recency."""
        item = self._items.get(key)
        return None if item is None else item[0]

    def get(self, key: K, default: V | None = None) -> V | None:
        item = self._items.get(key)
        if item is None:
            return default
        self._items.move_to_end(key)
        if self.max_idle_s:
            self._items[key] = (item[0], item[1], time.monotonic())
        return item[0]

    def put(self, key: K, value: V) -> bool:
        """Keep the item (most recent); False when it alone exceeds the byte bound (then it is not kept)."""
        size = self._size_of(key, value) if self.max_bytes else 0
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        now = time.monotonic() if self.max_idle_s else 0.0
        if self.max_bytes and size > self.max_bytes:
            if old is not None and self._on_drop is not None:
                self._on_drop(key, old[0])
            self._expire(now)
            return False
        self._items[key] = (value, size, now)
        self.bytes += size
        while len(self._items) > self.max_entries or (self.max_bytes and self.bytes > self.max_bytes):
            self._drop_oldest()
        self._expire(now)
        return True

    def _expire(self, now: float) -> None:
        if not self.max_idle_s:
            return
        horizon = now - self.max_idle_s
        while self._items and next(iter(self._items.values()))[2] <= horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        old_key, (old_value, old_size, _) = self._items.popitem(last=False)
        self.bytes -= old_size
        self.evictions += 1
        if self._on_drop is not None:
            self._on_drop(old_key, old_value)

    def resize(self, key: K) -> None:
        """Measure an item again after its value grew in place (e.g. a search index); evicts when over."""
        item = self._items.get(key)
        if item is not None:
            self.put(key, item[0])

    def pop(self, key: K, default: V | None = None) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return default
        self.bytes -= item[1]
        if self._on_drop is not None:
            self._on_drop(key, item[0])
        return item[0]

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0

    def cache_stats(self) -> CacheStats:
        return CacheStats(len(self._items), self.bytes if self.max_bytes else -1, self.max_entries, self.max_bytes,
                          self.evictions)


class LruCacheStats:
    """Stats of a ``functools.lru_cache``-wrapped function whose keys and values are bounded in length (at most
    ``max_item_bytes`` each, key and value together), so its entry bound is a byte bound too (hits do not count as
    evictions)."""

    def __init__(self, function: Any, max_item_bytes: int) -> None:
        self.function = function
        self.max_item_bytes = max_item_bytes

    def cache_stats(self) -> CacheStats:
        info = self.function.cache_info()
        evicted = max(0, info.misses - info.currsize) if info.maxsize else 0
        return CacheStats(info.currsize, info.currsize * self.max_item_bytes, info.maxsize or 0,
                          (info.maxsize or 0) * self.max_item_bytes, evicted)


class MemoStats:
    """Stats of a memci_proxy.engine.memo.SizedMemo (bounded in entries and bytes)."""

    def __init__(self, memo: Any) -> None:
        self.memo = memo

    def cache_stats(self) -> CacheStats:
        m = self.memo
        return CacheStats(len(m), m.bytes, m.max_entries, m.max_bytes, m.evictions)


class _FunctionStats:
    def __init__(self, fn: Callable[[], CacheStats]) -> None:
        self.fn = fn

    def cache_stats(self) -> CacheStats:
        return self.fn()


_lock = threading.Lock()
_sources: dict[str, weakref.WeakSet[Any]] = {}
_strong: list[Any] = []  # module-level sources (kept alive for the life of the process)


def register(name: str, source: Any, keep: bool = False) -> None:
    """Report ``source.cache_stats()`` under ``name`` (several live sources of one name are summed; a source
    that is garbage-collected stops reporting). ``keep``: hold a strong reference (module-level caches)."""
    with _lock:
        _sources.setdefault(name, weakref.WeakSet()).add(source)
        if keep:
            _strong.append(source)


def register_function(name: str, fn: Callable[[], CacheStats]) -> None:
    register(name, _FunctionStats(fn), keep=True)


def register_lru_cache(name: str, function: Any, max_item_bytes: int) -> None:
    register(name, LruCacheStats(function, max_item_bytes), keep=True)


def register_memo(name: str, memo: Any) -> None:
    """Report a SizedMemo (a ``memci_proxy.engine.memo.memoised`` function's ``memo``, or one held by a module)."""
    register(name, MemoStats(memo), keep=True)


def snapshot() -> dict[str, CacheStats]:
    """Every registered cache's current figures, summed by name."""
    with _lock:
        groups = {name: list(sources) for name, sources in _sources.items()}
    out: dict[str, CacheStats] = {}
    for name, sources in sorted(groups.items()):
        stats = [s.cache_stats() for s in sources]
        if not stats:
            continue
        measured = [s.bytes for s in stats if s.bytes >= 0]
        out[name] = CacheStats(
            entries=sum(s.entries for s in stats),
            bytes=sum(measured) if measured else -1,
            max_entries=sum(s.max_entries for s in stats),
            max_bytes=sum(s.max_bytes for s in stats),
            evictions=sum(s.evictions for s in stats),
        )
    return out


class CacheCollector:
    """A prometheus_client collector over the registered caches."""

    def describe(self) -> Iterator[Any]:
        """The families without samples (what the registry checks names with, and docs/metrics.md lists)."""
        yield from self._families()

    def collect(self) -> Iterator[Any]:
        entries, size, max_entries, max_bytes, evictions = self._families()
        for name, s in snapshot().items():
            entries.add_metric([name], s.entries)
            size.add_metric([name], s.bytes)
            max_entries.add_metric([name], s.max_entries)
            max_bytes.add_metric([name], s.max_bytes)
            evictions.add_metric([name], s.evictions)
        yield from (entries, size, max_entries, max_bytes, evictions)

    @staticmethod
    def _families() -> tuple[Any, ...]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        entries = GaugeMetricFamily("memci_cache_entries", "Items held by a per-process cache.", labels=["cache"])
        size = GaugeMetricFamily("memci_cache_bytes", "Approximate bytes held by a per-process cache (-1: not "
                                 "measured; bounded in entries).", labels=["cache"])
        max_entries = GaugeMetricFamily("memci_cache_max_entries", "Entry bound of a per-process cache.",
                                        labels=["cache"])
        max_bytes = GaugeMetricFamily("memci_cache_max_bytes", "Byte bound of a per-process cache (0: none).",
                                      labels=["cache"])
        evictions = CounterMetricFamily("memci_cache_evictions", "Items a per-process cache dropped to stay in "
                                        "its bounds.", labels=["cache"])
        return entries, size, max_entries, max_bytes, evictions
