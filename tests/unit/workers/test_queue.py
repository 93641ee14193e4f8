"""The in-process job queue and the worker's dispatch (a fake store)."""

from __future__ import annotations

from proxy.workers.queue import ARCHIVE_JOB, PROFILE_JOB, SUMMARY_JOB, InProcessJobQueue, Job
from proxy.workers.runner import MemoryWorker


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
    assert [await queue.get(), await queue.get()] == [Job(SUMMARY_JOB, "t", "c"), Job(PROFILE_JOB, "t", "c")]
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
