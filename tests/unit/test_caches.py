"""The bounded LRU map every per-process cache uses (memci_proxy.caches.BoundedLru)."""

from memci_proxy import caches
from memci_proxy.caches import BoundedLru


def _size(_key: str, value: str) -> int:
    return len(value)


def test_entries_idle_longer_than_the_bound_leave_on_the_next_write(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(caches.time, "monotonic", lambda: now[0])
    cache: BoundedLru[str, str] = BoundedLru("test_idle", 100, 10_000, _size, max_idle_s=60)
    cache.put("a", "x")
    cache.put("b", "y")
    now[0] += 50
    assert cache.get("a") == "x"  # read: fresh again
    now[0] += 20
    cache.put("c", "z")  # b idle for 70 s: gone; a read 20 s ago: kept
    assert "b" not in cache and cache.get("a") == "x" and cache.get("c") == "z"
    assert cache.evictions == 1 and cache.bytes == 2


def test_without_an_idle_bound_only_the_size_bounds_evict(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(caches.time, "monotonic", lambda: now[0])
    cache: BoundedLru[str, str] = BoundedLru("test_sizes", 2, 10_000, _size)
    cache.put("a", "x")
    now[0] += 10**6
    cache.put("b", "y")
    assert "a" in cache
    cache.put("c", "z")
    assert "a" not in cache and len(cache) == 2 and cache.evictions == 1


def test_a_named_cache_reports_with_the_process_caches():
    cache: BoundedLru[str, str] = BoundedLru("test_sized_lru", 10, 1000, _size)
    cache.put("a", "hello")
    stats = caches.snapshot()["test_sized_lru"]
    assert stats.entries == 1 and stats.bytes == 5 and stats.max_bytes == 1000
