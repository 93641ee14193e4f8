"""Background page embedding (memci_proxy.recall.vectors.backlog with PageVectors): it waits for a moment without
turns, yet under steady traffic every page is embedded within a bounded lag; the backlog and the lag are metrics."""

from __future__ import annotations

import asyncio
import time

from memci_proxy.engine import EstimateCounter
from memci_proxy.metrics import Metrics
from memci_proxy.recall.vectors.backlog import EmbeddingBacklog
from memci_proxy.recall.resolver import RecallResolver
from memci_proxy.recall.vectors.index import PageVectors
from tests.unit.recall.search.test_embeddings_fusion import PAGES, MemoryVectorStore, _context
from tests.unit.recall.vectors.test_local_embedder import _embedder


def _sample(metrics: Metrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


async def _steady_traffic(vectors: PageVectors, every_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        vectors.mark_busy()  # what every turn start does
        await asyncio.sleep(every_s)


async def test_background_embedding_waits_for_a_moment_without_turns() -> None:
    embedder, model = _embedder()
    embedder._model()
    vectors = PageVectors(MemoryVectorStore(), embedder, inline_pages=0, max_lag_s=5.0)
    vectors.backlog.quiet_s = 0.3
    resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors)
    vectors.mark_busy()  # a turn just started
    await resolver.prepare(_context(PAGES))
    await asyncio.sleep(0.1)
    assert model.inputs == []  # deferred while turns run
    await vectors.drain()
    assert len(model.inputs) == 1  # then embedded
    await vectors.close()


async def test_steady_traffic_cannot_starve_the_backlog_and_its_lag_is_measured() -> None:
    """Turns start every 20 ms, so no quiet moment of 10 s ever comes: three batches of pages are still all embedded
    about ``max_lag_s`` after they were archived, not one ``max_lag_s`` per batch."""
    metrics = Metrics()
    embedder, model = _embedder()
    embedder._model()
    vectors = PageVectors(MemoryVectorStore(), embedder, inline_pages=2, max_lag_s=0.4, metrics=metrics)
    vectors.backlog.quiet_s = 10.0
    resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors)
    stop = asyncio.Event()
    traffic = asyncio.create_task(_steady_traffic(vectors, 0.02, stop))
    pages = {n: f"Page {n} speaks of topic number {n}." for n in range(1, 7)}  # three batches of two
    started = time.monotonic()
    await resolver.prepare(_context(pages))
    await asyncio.sleep(0.1)
    assert model.inputs == []  # not beside the turns while the pages are young
    assert _sample(metrics, "memci_embedding_backlog_pages") == 6
    assert _sample(metrics, "memci_embedding_backlog_age_seconds") >= 0.1
    await vectors.drain()
    elapsed = time.monotonic() - started
    stop.set()
    await traffic
    assert [len(batch) for batch in model.inputs] == [2, 2, 2]
    assert 0.4 <= elapsed < 0.8  # one lag bound for the whole backlog (per batch it would be >= 1.2 s)
    assert _sample(metrics, "memci_embedding_backlog_pages") == 0
    assert _sample(metrics, "memci_embedding_backlog_age_seconds") == 0
    assert _sample(metrics, "memci_page_embedding_lag_seconds_count") == 6
    assert 2.4 <= _sample(metrics, "memci_page_embedding_lag_seconds_sum") < 6 * 0.8
    await vectors.close()


async def test_failed_pages_keep_their_age_and_are_served_at_once_next_time() -> None:
    backlog = EmbeddingBacklog(quiet_s=60.0, max_lag_s=0.2)
    backlog.arrived("c1", ["1", "2"])
    backlog.mark_busy()
    started = time.monotonic()
    await backlog.wait_turn("c1")  # busy: waits for the lag bound
    assert 0.2 <= time.monotonic() - started < 0.5
    backlog.arrived("c1", ["2", "3"])  # page 2 keeps its first arrival
    started = time.monotonic()
    await backlog.wait_turn("c1")  # overdue already: no wait
    assert time.monotonic() - started < 0.05
    backlog.embedded("c1", ["1", "2"])
    assert backlog.pages() == 1 and backlog.oldest_age_s() < 0.1
    backlog.forget("c1")
    assert backlog.pages() == 0 and backlog.oldest_age_s() == 0.0

