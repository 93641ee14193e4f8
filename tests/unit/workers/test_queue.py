"""The in-process job queue and the worker's dispatch (a fake store)."""

from __future__ import annotations

from types import SimpleNamespace

from memci_proxy.workers.queue import ARCHIVE_JOB, PROFILE_JOB, SUMMARY_JOB, InProcessJobQueue, Job
from memci_proxy.workers.runner import MemoryWorker


async def test_one_waiting_job_per_key() -> None:
    queue = InProcessJobQueue()
    a, b = Job(SUMMARY_JOB, "t", "c1"), Job(SUMMARY_JOB, "t", "c2")
    for job in (a, a, b, a):
        await queue.put(job)
    assert queue.pending() == 2
    seen: list[Job] = []

    async def handler(job: Job) -> None:
        seen.append(job)
        if job is a:
            raise RuntimeError("a failing handler does not stop the queue")

    assert await queue.drain(handler) == 2
    assert seen == [a, b]
    await queue.put(a)  # taken off the queue: may wait again
    assert queue.pending() == 1


async def test_a_full_queue_drops_and_counts() -> None:
    queue = InProcessJobQueue(maxsize=1)
    await queue.put(Job(SUMMARY_JOB, "t", "c1"))
    await queue.put(Job(SUMMARY_JOB, "t", "c2"))
    assert queue.pending() == 1 and queue.dropped == 1


async def test_notify_queues_the_summary_and_the_profile() -> None:
    queue = InProcessJobQueue()
    worker = MemoryWorker(repo=None, summarizer=None, queue=queue)  # type: ignore[arg-type]
    await worker.notify("t", "c")
    assert [await queue.get() for _ in range(3)] == [
        Job(SUMMARY_JOB, "t", "c"), Job(PROFILE_JOB, "t", "c"), Job(ARCHIVE_JOB, "t", "c")
    ]
    assert Job.from_fields(Job(ARCHIVE_JOB, "t", "c").fields()) == Job(ARCHIVE_JOB, "t", "c")


class FakeRepo:
    def __init__(self) -> None:
        self.reads = 0

    async def get_summary(self, tenant: str, conversation_id: str, kind: str, period: str = ""):
        self.reads += 1
        raise ConnectionError("database down")


async def test_latest_summary_is_empty_when_the_store_fails() -> None:
    worker = MemoryWorker(FakeRepo(), None, InProcessJobQueue())  # type: ignore[arg-type]
    assert await worker.latest_summary("t", "c") == ""


def test_config_reads_only_its_own_settings() -> None:
    from types import SimpleNamespace

    from memci_proxy.workers.config import MemoryConfig

    settings = SimpleNamespace(max_summary_tokens=500, archive_verbatim_days=3, summary_cache_ttl_s=0.0,
                               cache_ttl=300.0, history_soft_limit=200)
    config = MemoryConfig.from_settings(settings)
    assert (config.max_summary_tokens, config.verbatim_days, config.cache_ttl_s) == (500, 3, 0.0)
    assert config.history_soft_limit == 200 and config.history_hard_limit == 0


class SweepRepo:
    def __init__(self) -> None:
        self.due_reads = 0

    async def due_summaries(self, now, limit: int = 100):
        self.due_reads += 1
        return [("t", SimpleNamespace(kind="day", conversation_id="c1"))]

    async def conversations_with_entries(self, after_id: str = "", limit: int = 200):
        rows = [("t", "c1"), ("t", "c2")]
        return [r for r in rows if r[1] > after_id]


async def test_tick_retries_due_work_and_enqueues_the_daily_sweep_once() -> None:
    import datetime as dt

    now = [dt.datetime(2026, 3, 1, 23, 0, tzinfo=dt.timezone.utc)]
    queue = InProcessJobQueue()
    worker = MemoryWorker(SweepRepo(), None, queue, clock=lambda: now[0])  # type: ignore[arg-type]
    handled: list[Job] = []

    async def handle(job: Job, when=None) -> str:
        handled.append(job)
        return "done"

    worker.handle = handle  # type: ignore[method-assign]
    await worker.tick()
    assert handled == [Job(ARCHIVE_JOB, "t", "c1")]  # the due retry, at once
    assert queue.pending() == 2  # the day's sweep, queued
    await queue.drain(handle)
    await worker.tick()
    assert queue.pending() == 0  # same day: no second sweep
    now[0] += dt.timedelta(hours=2)
    await worker.tick()
    assert queue.pending() == 2  # a new UTC day


async def test_a_waiting_job_taken_by_its_caller_is_not_handed_out_again():
    from memci_proxy.workers.queue import InProcessJobQueue, Job

    queue = InProcessJobQueue()
    first, second = Job("summary", "t", "c1"), Job("summary", "t", "c2")
    await queue.put(first)
    await queue.put(second)
    assert queue.take(first) and not queue.take(first)  # taken once
    assert await queue.get() == second
    await queue.put(first)  # queued again later: handed out then
    assert await queue.get() == first
