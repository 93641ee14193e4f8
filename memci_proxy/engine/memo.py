"""Memos of the engine (and of the search, which shares its text functions), bounded in entries and in bytes.

A memo keyed by client text (a message's entities, a word's stem) must not hold a process's memory hostage: one
10 MB message memoised 4,096 times would be 40 GB. ``SizedMemo`` is an LRU map that counts approximately what its
keys and values hold (``text_size``) and drops the least recently used items past either bound; an item larger
than the whole byte bound is computed and not kept. ``memoised`` wraps a one-argument function in one. The engine
stays free of I/O and clocks; memci_proxy.turn.memos reports every memo with the process's caches (memci_proxy.caches).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
_OVERHEAD = 64  # per item: the map's slot, the tuple, the size


def text_size(value: Any) -> int:
    """Approximate bytes held by ``value``: text and bytes by their length, containers by their items (two levels
    deep, which covers every memo here), anything else by ``sys.getsizeof``."""
    if isinstance(value, (str, bytes)):
        return len(value) + 49
    if isinstance(value, (tuple, list, frozenset, set)):
        return 56 + sum(len(v) + 49 if isinstance(v, (str, bytes)) else sys.getsizeof(v) for v in value)
    return sys.getsizeof(value)


class SizedMemo(Generic[K, V]):
    """An LRU map bounded in entries and in approximate bytes (keys and values both counted)."""

    def __init__(self, max_entries: int, max_bytes: int, size_of: Callable[[K, V], int] | None = None) -> None:
        self.max_entries = max(1, int(max_entries))
        self.max_bytes = max(1, int(max_bytes))
        self._size_of = size_of or (lambda key, value: text_size(key) + text_size(value))
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K, default: V | None = None) -> V | None:
        item = self._items.get(key)
        if item is None:
            return default
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V) -> None:
        size = self._size_of(key, value) + _OVERHEAD
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if size > self.max_bytes:
            return
        self._items[key] = (value, size)
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            self.bytes -= self._items.popitem(last=False)[1][1]
            self.evictions += 1

    def clear(self) -> None:
        self._items.clear()
        self.bytes = 0


_MISSING = object()


def memoised(max_entries: int, max_bytes: int) -> Callable[[Callable[[K], V]], Callable[[K], V]]:
    """A decorator: the one-argument function memoised in a ``SizedMemo`` (its ``memo`` attribute; ``cache_clear``
    empties it, as with functools.lru_cache)."""

    def wrap(function: Callable[[K], V]) -> Callable[[K], V]:
        memo: SizedMemo[K, V] = SizedMemo(max_entries, max_bytes)

        def memoised_function(arg: K) -> V:
            value = memo.get(arg, _MISSING)  # type: ignore[arg-type]
            if value is _MISSING:
                value = function(arg)
                memo.put(arg, value)
            return value  # type: ignore[return-value]

        memoised_function.memo = memo  # type: ignore[attr-defined]
        memoised_function.cache_clear = memo.clear  # type: ignore[attr-defined]
        memoised_function.__doc__ = function.__doc__
        memoised_function.__name__ = function.__name__
        memoised_function.__wrapped__ = function  # type: ignore[attr-defined]
        return memoised_function

    return wrap
