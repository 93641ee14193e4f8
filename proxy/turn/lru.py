"""A per-process LRU map bounded both in entries and in bytes, with its size published as metrics."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SizedLru(Generic[K, V]):
    """Least recently used entries go first when either bound is crossed. ``size_of`` tells a value's size in
    bytes (an estimate is fine: the bound is on memory, not exact)."""

    def __init__(self, max_entries: int, max_bytes: int, size_of: Callable[[V], int]) -> None:
        self.max_entries = max(1, max_entries)
        self.max_bytes = max(1, max_bytes)
        self._size_of = size_of
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self.bytes = 0

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V, size: int | None = None) -> None:
        size = self._size_of(value) if size is None else size
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        if size > self.max_bytes:
            return  # larger than the whole cache: not kept
        self._items[key] = (value, size)
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped

    def pop(self, key: K, default: V | None = None) -> V | None:
        item = self._items.pop(key, None)
        if item is None:
            return default
        self.bytes -= item[1]
        return item[0]

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items
