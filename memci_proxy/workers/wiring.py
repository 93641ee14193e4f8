"""Builds the memory worker from the proxy's settings and store (the app's lifespan calls these)."""

from __future__ import annotations

import logging
from typing import Any

from memci_proxy.workers.config import MemoryConfig
from memci_proxy.workers.queue import InProcessJobQueue, JobQueue
from memci_proxy.workers.runner import MemoryWorker
from memci_proxy.workers.summarizer import ModelSummarizer

log = logging.getLogger("memci.workers")


def build_memory_worker(settings: Any, repo: Any, metrics: Any = None) -> MemoryWorker:
    """Summariser: ``summary_model_url`` or else the (first) upstream; queue: a Redis Stream when ``redis_url``
    is set, else in-process."""
    base_url = getattr(settings, "summary_model_url", "") or settings.upstream_urls[0]
    summarizer = ModelSummarizer(
        base_url,
        model=getattr(settings, "summary_model", ""),
        api_key=getattr(settings, "summary_model_api_key", "") or getattr(settings, "upstream_api_key", ""),
        timeout_s=float(getattr(settings, "summary_timeout_s", 60.0)),
        on_usage=None if metrics is None else metrics.observe_job_usage,
    )
    queue: JobQueue
    local: JobQueue | None = None  # jobs on a prompt this replica kept (memci_proxy.workers.runner)
    if getattr(settings, "redis_url", ""):
        from memci_proxy.workers.redis_queue import RedisStreamJobQueue

        queue, local = RedisStreamJobQueue(settings.redis_url), InProcessJobQueue()
    else:
        queue = InProcessJobQueue()
    worker = MemoryWorker(repo, summarizer, queue, MemoryConfig.from_settings(settings), metrics=metrics,
                          local_queue=local)
    log.info("memory workers: summaries by %s, job queue %s", base_url, queue.kind)
    return worker


async def start_memory_worker(services: Any) -> MemoryWorker | None:
    """Start the worker when context management is on and ``memory_workers`` is not switched off; stored on
    ``services.memory``."""
    if services.store is None or not getattr(services.settings, "memory_workers", True):
        services.memory = None
        return None
    worker = build_memory_worker(services.settings, services.store.repo, getattr(services, "metrics", None))
    await worker.start()
    services.memory = worker
    return worker


async def stop_memory_worker(services: Any) -> None:
    worker = getattr(services, "memory", None)
    if worker is not None:
        await worker.stop()
        services.memory = None
