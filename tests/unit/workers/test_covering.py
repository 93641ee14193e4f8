"""What an epoch takes from the memory workers: the summary and profile once their jobs have taken in every page
archived before it (memci_proxy.workers.covering), cached by how far they cover, never by a time to live."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass

from memci_proxy.engine.state import ARCHIVED, ConversationState, PageRecord
from memci_proxy.workers.covering import EMPTY, Covered, CoveredMemory, archived_through


@dataclass
class Row:
    status: str
    last_seq: int
    text: str = ""
    next_attempt_at: dt.datetime | None = None


class Repo:
    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.facts: list[str] = []
        self.reads = 0

    async def get_summary(self, tenant: str, conversation_id: str, kind: str):
        self.reads += 1
        return self.rows.get(kind)

    async def profile_facts(self, tenant: str, conversation_id: str, end_user: str, limit: int) -> list[str]:
        return self.facts[:limit]

    def done(self, last_seq: int, text: str) -> None:
        self.rows = {"conversation": Row("done", last_seq, text), "profile": Row("done", last_seq)}


async def _no_user_profile(tenant: str, conversation_id: str, end_user: str) -> str:
    return "- a user's fact"


def memory(repo: Repo) -> CoveredMemory:
    return CoveredMemory(repo, 30, _no_user_profile)


def test_archived_through_is_the_last_message_of_the_archived_pages():
    state = ConversationState(pages=[PageRecord(1, 1, 0, 4, 100, ARCHIVED), PageRecord(2, 1, 4, 9, 100, ARCHIVED),
                                     PageRecord(3, 1, 9, 12, 100)], first_active_page=2)
    assert archived_through(state) == 8
    assert archived_through(ConversationState()) == -1 and archived_through(None) == -1


async def test_nothing_archived_reads_nothing():
    repo = Repo()
    assert await memory(repo).read("t", "c", -1) == EMPTY and repo.reads == 0


async def test_the_summary_counts_once_both_jobs_took_in_the_archived_pages_and_is_then_cached():
    repo, covered = Repo(), None
    m = memory(repo)
    repo.rows = {"conversation": Row("done", 8, "S8")}  # the profile job has not run yet
    assert await m.wait("t", "c", 8, "", timeout_s=0) is None
    repo.done(5, "S5")
    assert await m.wait("t", "c", 8, "", timeout_s=0) is None  # both behind (the previous epoch's pages only)
    repo.done(8, "S8")
    repo.facts = ["Ada"]
    covered = await m.read("t", "c", 8)
    assert covered == Covered("S8", "- Ada")
    reads = repo.reads
    repo.done(20, "S20")  # a later job: the value for this coverage is the cached one, read once
    assert await m.read("t", "c", 8) == covered and repo.reads == reads
    assert await m.read("t", "c", 8, end_user="u1") == Covered("S8", "- a user's fact")


async def test_an_epoch_waits_for_late_jobs_not_for_failed_ones():
    repo = Repo()
    m = memory(repo)

    async def job_done_later() -> None:
        await asyncio.sleep(0.15)
        repo.done(8, "S8")

    late = asyncio.create_task(job_done_later())
    assert await m.wait("t", "c", 8, "", timeout_s=5) == Covered("S8", "")
    await late
    assert await m.wait("t", "c", 30, "", timeout_s=0.2) is None  # still behind at the deadline
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=10)
    repo.rows["conversation"] = Row("done", 8, "S8", next_attempt_at=soon)
    started = asyncio.get_running_loop().time()
    assert await m.wait("t", "c", 30, "", timeout_s=5) is None
    assert asyncio.get_running_loop().time() - started < 1  # backing off: no wait
    assert m.waits == {"ready": 1, "behind": 1, "failed": 1}


async def test_turns_between_epochs_do_not_ask_again_at_once_while_the_jobs_are_behind():
    repo = Repo()
    m = memory(repo)
    assert await m.read("t", "c", 8) is None
    reads = repo.reads
    repo.done(8, "S8")
    assert await m.read("t", "c", 8) is None and repo.reads == reads  # the next turn, a moment later
    assert await m.wait("t", "c", 8, "", timeout_s=1) == Covered("S8", "")  # an epoch always asks


async def test_an_epoch_waiting_for_its_jobs_starts_them_ahead_of_the_other_conversations():
    from memci_proxy.workers.config import MemoryConfig
    from memci_proxy.workers.queue import InProcessJobQueue, Job
    from memci_proxy.workers.runner import MemoryWorker

    repo, queue, handled = Repo(), InProcessJobQueue(), []
    worker = MemoryWorker(repo, summarizer=None, queue=queue, config=MemoryConfig(wait_s=2.0))

    async def run(job: Job, now) -> None:  # the job as the consumer would run it
        handled.append(job)
        if len(handled) == 2:
            repo.done(8, "S8")

    worker._safe_handle = run  # type: ignore[method-assign]
    await queue.put(Job("summary", "t", "another conversation"))
    await worker._enqueue("t", "c")  # behind the other conversation's jobs; no consumer runs at all here
    assert await worker.wait_covering("t", "c", 8) == Covered("S8", "")
    assert handled == [Job("summary", "t", "c"), Job("profile", "t", "c")]
    assert [await queue.get() for _ in range(2)] == [Job("summary", "t", "another conversation"),
                                                     Job("archive", "t", "c")]


async def test_a_job_ending_in_this_process_wakes_the_waiting_epoch_at_once():
    repo = Repo()
    m = memory(repo)

    async def job_done() -> None:
        await asyncio.sleep(0.01)
        repo.done(8, "S8")
        m.jobs_ran("t", "c")

    done = asyncio.create_task(job_done())
    started = asyncio.get_running_loop().time()
    assert await m.wait("t", "c", 8, "", timeout_s=5) == Covered("S8", "")
    assert asyncio.get_running_loop().time() - started < 0.04  # not at the first poll (0.05 s)
    await done
    assert m._waiting == {}  # nothing left of the wait
    m.jobs_ran("t", "c")  # no one waiting: nothing to do


async def test_jobs_that_end_with_no_epoch_waiting_are_read_behind_the_turns():
    repo = Repo()
    m = memory(repo)
    assert await m.read("t", "c", 8) is None  # a turn after the epoch: its jobs are behind (marked for a second)
    repo.done(8, "S8")
    m.jobs_ran("t", "c")
    await asyncio.sleep(0)
    await asyncio.gather(*m._refreshing.values())
    reads = repo.reads
    # the turns between epochs see the jobs caught up; the next epoch takes the cached value, no read, no wait
    assert await m.read("t", "c", 8) == Covered("S8", "")
    assert await m.wait("t", "c", 8, "", timeout_s=5) == Covered("S8", "")
    assert repo.reads == reads and m.waits == {"ready": 1}


async def test_a_job_behind_the_other_leaves_the_mark_until_both_cover():
    repo = Repo()
    m = memory(repo)
    assert await m.read("t", "c", 8) is None
    repo.rows = {"conversation": Row("done", 8, "S8"), "profile": Row("done", 5)}  # the summary job ended first
    m.jobs_ran("t", "c")
    await asyncio.gather(*m._refreshing.values())
    assert await m.read("t", "c", 8) is None  # still behind: the mark stays (no read at each turn)
    repo.done(8, "S8")
    m.jobs_ran("t", "c")  # the profile job
    await asyncio.gather(*m._refreshing.values())
    assert await m.read("t", "c", 8) == Covered("S8", "")


async def test_a_job_ending_during_a_read_is_read_again():
    repo = Repo()
    m = memory(repo)
    gate = asyncio.Event()
    get_summary = repo.get_summary

    async def slow(tenant: str, conversation_id: str, kind: str):
        await gate.wait()
        return await get_summary(tenant, conversation_id, kind)

    repo.get_summary = slow  # type: ignore[method-assign]
    repo.done(5, "S5")
    m.jobs_ran("t", "c")
    await asyncio.sleep(0)
    repo.done(8, "S8")
    m.jobs_ran("t", "c")  # while the first read waits: read again after it
    gate.set()
    while m._refreshing:
        await asyncio.gather(*m._refreshing.values())
    reads = repo.reads
    assert await m.read("t", "c", 8) == Covered("S8", "") and repo.reads == reads


async def test_forgetting_a_conversation_cancels_its_read():
    repo = Repo()
    m = memory(repo)
    gate = asyncio.Event()

    async def never(tenant: str, conversation_id: str, kind: str):
        await gate.wait()

    repo.get_summary = never  # type: ignore[method-assign]
    m.jobs_ran("t", "c")
    await asyncio.sleep(0)
    task = m._refreshing[("t", "c")]
    m.forget("t", "c")
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and m._refreshing == {} and m._cache.peek(("t", "c")) is None
    m.jobs_ran("t", "c")
    await m.close()
    assert m._refreshing == {}
