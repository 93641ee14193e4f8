"""Which upstream worker serves a request: rendezvous hashing on the conversation, skipping failed workers.

Each conversation goes to the worker with the highest hash of (worker, routing key), so its KV prefix stays
on one GPU; adding a worker moves only about 1/n of the conversations. A worker that fails (a connection
failure at once, or ``down_after`` consecutive 5xx answers) is skipped for ``down_seconds`` and then tried
again; its conversations go to their next-ranked worker meanwhile. When every worker is down they are all
tried anyway, in rank order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash
from prometheus_client import CollectorRegistry, Counter, Gauge



def rendezvous_order(key: str, workers: Sequence[str]) -> list[str]:
    """Workers by decreasing hash of (worker, key): the first one serves the key while it is up."""
    encoded = key.encode()
    return sorted(workers, key=lambda w: xxhash.xxh3_64_intdigest(w.encode() + b"\0" + encoded), reverse=True)


@dataclass
class _Health:
    consecutive_errors: int = 0
    down_until: float = 0.0


class WorkerHealth:
    """Down-marking with a cool-down, on an injectable clock."""

    def __init__(self, workers: Sequence[str], down_after: int, down_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workers = list(workers)
        self.down_after = max(1, down_after)
        self.down_seconds = down_seconds
        self.clock = clock
        self._health = {w: _Health() for w in self.workers}

    def is_down(self, worker: str) -> bool:
        return self._health[worker].down_until > self.clock()

    def down_count(self) -> int:
        now = self.clock()
        return sum(1 for h in self._health.values() if h.down_until > now)

    def connection_failed(self, worker: str) -> None:
        h = self._health[worker]
        h.consecutive_errors = max(h.consecutive_errors + 1, self.down_after)
        h.down_until = self.clock() + self.down_seconds

    def server_error(self, worker: str) -> None:
        h = self._health[worker]
        h.consecutive_errors += 1
        if h.consecutive_errors >= self.down_after:
            h.down_until = self.clock() + self.down_seconds

    def succeeded(self, worker: str) -> None:
        h = self._health[worker]
        h.consecutive_errors = 0
        h.down_until = 0.0


class WorkerRouter:
    """Ranks the workers for a routing key (up ones first) and records what each attempt did."""

    def __init__(self, workers: Sequence[str], down_after: int = 3, down_seconds: float = 10.0,
                 registry: CollectorRegistry | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not workers:
            raise ValueError("at least one upstream worker is needed")
        self.workers = list(workers)
        self.health = WorkerHealth(self.workers, down_after, down_seconds, clock)
        self._requests: Counter | None = None
        self._down: Gauge | None = None
        self._counted: dict[tuple[str, str], Any] = {}
        self._down_shown = 0  # workers the gauge shows down (it is left alone while all is well)
        if registry is not None:
            self._requests = Counter(
                "memci_upstream_worker_requests", "Upstream requests by worker and outcome.", ["worker", "outcome"],
                registry=registry,
            )
            self._down = Gauge("memci_upstream_workers_down", "Upstream workers being skipped now.", registry=registry)

    def candidates(self, route_key: str | None) -> list[str]:
        """Every worker, the ones to try first first: up workers in rendezvous order, then the down ones."""
        if len(self.workers) == 1:
            return list(self.workers)
        ranked = rendezvous_order(route_key or "", self.workers)
        up = [w for w in ranked if not self.health.is_down(w)]
        return up + [w for w in ranked if w not in up]

    def record(self, worker: str, outcome: str) -> None:
        """outcome: ``ok`` (any answer below 500), ``server_error`` (5xx) or ``connect_error``."""
        if outcome == "ok":
            self.health.succeeded(worker)
        elif outcome == "server_error":
            self.health.server_error(worker)
        elif outcome == "connect_error":
            self.health.connection_failed(worker)
        if self._requests is not None:
            child = self._counted.get((worker, outcome))
            if child is None:
                child = self._counted[(worker, outcome)] = self._requests.labels(worker, outcome)
            child.inc()
        if self._down is not None and (outcome != "ok" or self._down_shown):
            self._down_shown = self.health.down_count()
            self._down.set(self._down_shown)

    def worker_of(self, url: str) -> str | None:
        """The worker a URL was built on (longest base URL that prefixes it)."""
        found = [w for w in self.workers if url.startswith(w)]
        return max(found, key=len) if found else None
