"""The memory worker: consumes the job queue, retries what is due, sweeps archival by age, and serves the
latest summary and profile to the managed turn (cached).

    worker = MemoryWorker(repo, summarizer, queue, config)          # clock: injected, UTC datetimes
    await worker.start()                                            # queue consumer + periodic sweep
    worker.keep_base(tenant, conversation_id, base)                 # the pre-epoch prompt (memci_proxy.workers.prefix)
    await worker.notify(tenant, conversation_id)                    # after a turn that archived pages
    worker.touch(tenant, conversation_id)                           # after every turn (the idle delay)
    covered = await worker.covering(tenant, conversation_id, through, end_user)  # TurnInput summary, profile
    covered = await worker.wait_covering(tenant, conversation_id, through, end_user)  # at an epoch, if None
    await worker.stop()

Summary and profile jobs run right after the epoch (``notify``), or with ``idle_s`` > 0 once the conversation has had
no turn for that long (``touch`` pushes the moment back; a second epoch before it runs the first one's jobs at once),
or, on a one-slot engine, before the epoch's request (``run_before``, then ``notify(summaries=False)``).
They reuse the kept pre-epoch prompt when it still holds the pages (``memci_proxy.workers.prefix``), else plain calls;
so with a shared (Redis) queue the summary and profile jobs of an epoch run on the replica that kept that prompt
(``local_queue``: a lost one is harmless, the next epoch's jobs take its pages in), the archival on any replica.
What an epoch takes into the prompt: ``memci_proxy.workers.covering``.

Tests drive it without tasks: ``handle(job, now)``, ``run_due(now)``, ``sweep_all(now)``, ``run_idle(at)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.workers.archival import ArchiveSweep, SweepReport
from memci_proxy.workers.config import MemoryConfig
from memci_proxy.workers.covering import Covered, CoveredMemory
from memci_proxy.workers.prefix import SummaryBase
from memci_proxy.workers.queue import ARCHIVE_JOB, PROFILE_JOB, SUMMARY_JOB, Job, JobQueue
from memci_proxy.workers.page_reads import EpochPageReads
from memci_proxy.workers.summaries import render_profile, update_conversation_summary, update_profile
from memci_proxy.workers.summarizer import Summarizer

log = logging.getLogger("memci.workers")

Clock = Callable[[], dt.datetime]
BASES_PER_CONVERSATION = 2  # pre-epoch prompts kept per conversation (a job late by one epoch still finds its own)
MAX_IDLE_WAITING = 100_000  # conversations whose jobs wait for the idle delay
LOCAL_CONSUMERS = 4  # jobs of this replica's own queue run at once (one at a time per job and conversation)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class MemoryWorker:
    def __init__(
        self,
        repo: Any,
        summarizer: Summarizer,
        queue: JobQueue,
        config: MemoryConfig | None = None,
        clock: Clock = utc_now,
        metrics: Any = None,
        local_queue: JobQueue | None = None,
    ) -> None:
        self.repo, self.summarizer, self.queue = repo, summarizer, queue
        self.local_queue = local_queue  # this replica's own (the queue is shared): jobs on a prompt kept here
        self.config = config or MemoryConfig()
        self.clock = clock
        self.sweep = ArchiveSweep(repo, summarizer, self.config)
        # Per-process caches, bounded in entries and bytes (memci_proxy.caches); a miss reads PostgreSQL.
        self._summaries: BoundedLru[tuple[str, str], tuple[float, str]] = BoundedLru(
            "summaries", 10_000, 32 * 2**20, size_of=lambda k, v: 160 + len(k[0]) + len(k[1]) + len(v[1]))
        self._profiles: BoundedLru[tuple[str, str], tuple[float, str]] = BoundedLru(
            "profiles", 10_000, 16 * 2**20, size_of=lambda k, v: 160 + len(k[0]) + len(k[1]) + len(v[1]))
        # Pre-epoch prompts (the newest BASES_PER_CONVERSATION per conversation) for jobs on the cached prefix.
        self._bases: BoundedLru[tuple[str, str], tuple[SummaryBase, ...]] = BoundedLru(
            "summary_bases", self.config.bases_max_entries, self.config.bases_max_mb * 2**20,
            size_of=lambda k, v: 256 + sum(b.size for b in v))
        self._idle: dict[tuple[str, str], float] = {}  # conversation -> monotonic time its jobs are due (idle_s > 0)
        self._tasks: list[asyncio.Task[None]] = []
        self._before: set[asyncio.Task[None]] = set()  # jobs of run_before still running
        self._job_locks: dict[Job, asyncio.Lock] = {}
        self.outcomes: dict[str, int] = {}
        self.calls: dict[str, int] = {}  # summariser calls by kind: "prefix" (on a kept prompt), "plain"
        self.metrics = metrics  # memci_proxy.metrics.Metrics (memci_summary_calls) when the app runs the worker
        self._swept_on = ""
        # conversation -> the UTC day its archival by age was last queued after an epoch (``_archive_due``)
        self._archived_on: BoundedLru[tuple[str, str], str] = BoundedLru(
            "archival_days", 100_000, 16 * 2**20, size_of=lambda k, v: 160 + len(k[0]) + len(k[1]))
        self.page_reads = EpochPageReads(repo)  # an epoch's new pages, read once for its two jobs
        self.covered = CoveredMemory(repo, self.config.profile_max_facts, self.latest_profile, clock, self._waited)

    # --- what the managed turn calls ----------------------------------------------------------
    def keep_base(self, tenant: str, conversation_id: str, base: SummaryBase) -> None:
        """The last upstream prompt that held the pages an epoch is archiving (the prompt sent before it)."""
        key = (tenant, conversation_id)
        kept = self._bases.peek(key) or ()
        self._bases.put(key, (*kept, base)[-BASES_PER_CONVERSATION:])

    def bases(self, tenant: str, conversation_id: str) -> tuple[SummaryBase, ...]:
        """The kept prompts of a conversation, oldest first; none when the summariser is another server."""
        return (self._bases.peek((tenant, conversation_id)) or ()) if self.config.prefix_jobs else ()

    async def notify(self, tenant: str, conversation_id: str, summaries: bool = True) -> None:
        """Pages of the conversation were archived: bring its summary, the tenant's profile and its archival by
        age (limits included) up to date, now or (``idle_s``) once the conversation is idle. ``summaries=False``:
        the summary and profile jobs ran already (``run_before``), only the archival is queued."""
        key = (tenant, conversation_id)
        self.page_reads.drop(tenant, conversation_id)  # a read from before this epoch is not for a job after it
        if not summaries:
            self._idle.pop(key, None)
            if self._archive_due(tenant, conversation_id):
                await self.queue.put(Job(ARCHIVE_JOB, tenant, conversation_id))
            return
        if self.config.idle_s > 0:
            if key not in self._idle:
                if len(self._idle) >= MAX_IDLE_WAITING:  # bounded: the oldest waiting conversation runs now
                    await self._enqueue(*next(iter(self._idle)))
                self._idle[key] = time.monotonic() + self.config.idle_s
                return
            del self._idle[key]  # a second epoch before the first one's jobs ran: run them now
        await self._enqueue(tenant, conversation_id)

    @property
    def shares_upstream(self) -> bool:
        """The summary and profile jobs go to the conversation's upstream (no separate summariser)."""
        return self.config.prefix_jobs

    async def run_before(self, tenant: str, conversation_id: str, timeout_s: float) -> bool:
        """The summary and profile jobs of an epoch, run now, before the epoch's own request goes upstream (a
        one-slot engine: the slot still holds the pre-epoch prompt the jobs resend, and the epoch's request only
        shares its head with either). Waits at most ``timeout_s``; jobs still running then finish in the background
        (the engine answers them before the epoch's request). False when they were not started (nothing kept)."""
        if not self.bases(tenant, conversation_id):
            return False
        self._idle.pop((tenant, conversation_id), None)
        self.page_reads.drop(tenant, conversation_id)

        async def jobs() -> None:
            for kind in (SUMMARY_JOB, PROFILE_JOB):
                await self._safe_handle(Job(kind, tenant, conversation_id), self.clock())

        task = asyncio.get_running_loop().create_task(jobs())
        self._before.add(task)
        task.add_done_callback(self._before.discard)
        await asyncio.wait({task}, timeout=timeout_s)
        return True

    def touch(self, tenant: str, conversation_id: str) -> None:
        """A turn of the conversation ran: its waiting jobs (idle delay) wait for the next quiet moment."""
        key = (tenant, conversation_id)
        if key in self._idle:
            self._idle[key] = time.monotonic() + self.config.idle_s

    async def run_idle(self, at: float | None = None) -> int:
        """Queue the jobs of every conversation idle for ``idle_s`` (at the monotonic time ``at``); how many."""
        at = time.monotonic() if at is None else at
        due = [key for key, when in self._idle.items() if when <= at]
        for key in due:
            self._idle.pop(key, None)
            await self._enqueue(*key)
        return len(due)

    async def _enqueue(self, tenant: str, conversation_id: str) -> None:
        self._idle.pop((tenant, conversation_id), None)
        # on the prompt kept here: the same calls (and so the same summary) as one replica would make
        jobs = self.local_queue if self.local_queue is not None and self.bases(tenant, conversation_id) else self.queue
        await jobs.put(Job(SUMMARY_JOB, tenant, conversation_id))
        await jobs.put(Job(PROFILE_JOB, tenant, conversation_id))
        if self._archive_due(tenant, conversation_id):
            await self.queue.put(Job(ARCHIVE_JOB, tenant, conversation_id))

    def _archive_due(self, tenant: str, conversation_id: str) -> bool:
        """Whether an epoch queues the conversation's archival by age. The messages an epoch stores are today's,
        which stay verbatim: the plan by age changes with the day only, and the daily sweep of every conversation
        (``tick``) takes the day's change. So without a history limit (those change with every message) it is
        queued once a day per conversation, not after every epoch (its queries read the whole history)."""
        if self.config.history_soft_limit or self.config.history_hard_limit:
            return True
        key, today = (tenant, conversation_id), self.clock().date().isoformat()
        if self._archived_on.get(key) == today:
            return False
        self._archived_on.put(key, today)
        return True

    def created(self, tenant: str, conversation_id: str) -> None:
        """A conversation this process just created has no summary: its next turns need not ask the database (until
        the cache's time to live has passed, as for any cached summary, or a summary job here writes one)."""
        self._summaries.put((tenant, conversation_id), (time.monotonic(), ""))

    async def covering(self, tenant: str, conversation_id: str, through: int, end_user: str = "") -> Covered | None:
        """The summary and profile once the jobs have taken in the pages archived up to message ``through``
        (``memci_proxy.workers.covering``); None while they have not."""
        return await self.covered.read(tenant, conversation_id, through, end_user)

    async def wait_covering(self, tenant: str, conversation_id: str, through: int, end_user: str = "") -> Covered | None:
        """``covering``, waiting for the jobs at most ``summary_wait_s`` (an epoch's turn: the jobs of the previous
        epoch are late)."""
        if self.config.wait_s <= 0:
            return None
        self._hurry(tenant, conversation_id)
        return await self.covered.wait(tenant, conversation_id, through, end_user, self.config.wait_s)

    def _hurry(self, tenant: str, conversation_id: str) -> None:
        """The conversation's summary and profile jobs still waiting in this process's queue start now, ahead of
        the other conversations' (an epoch waits for them: its wait is their own time, not the queue's)."""
        queue = self.local_queue if self.local_queue is not None else self.queue
        take = getattr(queue, "take", None)
        for kind in (SUMMARY_JOB, PROFILE_JOB):
            job = Job(kind, tenant, conversation_id)
            if take is not None and take(job):
                task = asyncio.get_running_loop().create_task(self._safe_handle(job, self.clock()))
                self._before.add(task)
                task.add_done_callback(self._before.discard)

    async def latest_summary(self, tenant: str, conversation_id: str) -> str:
        """The conversation's summary by the model, '' until one exists (the contents lines serve meanwhile)."""
        key = (tenant, conversation_id)
        cached = self._summaries.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.config.cache_ttl_s:
            return cached[1]
        try:
            row = await self.repo.get_summary(tenant, conversation_id, "conversation")
        except Exception as exc:
            log.warning("could not read the summary of %s: %s", conversation_id, exc)
            return cached[1] if cached is not None else ""
        text = row.text if row is not None and row.status == "done" else ""
        self._summaries.put(key, (time.monotonic(), text))
        return text

    async def latest_profile(self, tenant: str, conversation_id: str, end_user: str = "") -> str:
        """The end user's stable facts as '- fact' lines ('' when none); without a user id (``end_user`` ""), the
        conversation's own: a tenant is an app, and one person's facts never reach another's prompt."""
        key = (tenant, "user:" + end_user if end_user else "conversation:" + conversation_id)
        cached = self._profiles.get(key)
        if cached is not None and time.monotonic() - cached[0] < self.config.cache_ttl_s:
            return cached[1]
        try:
            text = render_profile(await self.repo.profile_facts(tenant, conversation_id, end_user,
                                                                self.config.profile_max_facts))
        except Exception as exc:
            log.warning("could not read the profile of conversation %s: %s", conversation_id, exc)
            return cached[1] if cached is not None else ""
        self._profiles.put(key, (time.monotonic(), text))
        return text

    def forget(self, tenant: str, conversation_id: str) -> None:
        """Drop cached values (after a delete)."""
        self._summaries.pop((tenant, conversation_id))
        self.covered.forget(tenant, conversation_id)
        self._profiles.pop((tenant, "conversation:" + conversation_id))
        self._bases.pop((tenant, conversation_id))
        self.page_reads.drop(tenant, conversation_id)
        self._archived_on.pop((tenant, conversation_id))
        self._idle.pop((tenant, conversation_id), None)

    def forget_user(self, tenant: str, end_user: str) -> None:
        """Drop the end user's cached profile (after the user is deleted)."""
        self._profiles.pop((tenant, "user:" + end_user))

    # --- the jobs -----------------------------------------------------------------------------
    async def handle(self, job: Job, now: dt.datetime | None = None) -> str | SweepReport:
        lock = self._job_locks.setdefault(job, asyncio.Lock())
        try:
            async with lock:  # a conversation's summary (or profile) job at a time: each reads the other's progress
                return await self._handle(job, now or self.clock())
        finally:
            if job.kind in (SUMMARY_JOB, PROFILE_JOB):  # an epoch waiting for them reads their progress now
                self.covered.jobs_ran(job.tenant, job.conversation_id)
            if not lock.locked() and not getattr(lock, "_waiters", None):
                self._job_locks.pop(job, None)

    async def _handle(self, job: Job, now: dt.datetime) -> str | SweepReport:
        result: str | SweepReport
        if job.kind == SUMMARY_JOB:
            result = await update_conversation_summary(self.repo, self.summarizer, self.config, job.tenant,
                                                       job.conversation_id, now,
                                                       self.bases(job.tenant, job.conversation_id), self._count,
                                                       self.page_reads.reader(job.kind))
            self._summaries.pop((job.tenant, job.conversation_id))
        elif job.kind == PROFILE_JOB:
            result = await update_profile(self.repo, self.summarizer, self.config, job.tenant, job.conversation_id, now,
                                          self.bases(job.tenant, job.conversation_id), self._count,
                                          self.page_reads.reader(job.kind))
            self._profiles.pop(job.tenant)
        elif job.kind == ARCHIVE_JOB:
            result = await self.sweep.run(job.tenant, job.conversation_id, now)
        else:
            log.warning("unknown background job kind %r", job.kind)
            return "unknown"
        label = result if isinstance(result, str) else "archive"
        self.outcomes[f"{job.kind}:{label}"] = self.outcomes.get(f"{job.kind}:{label}", 0) + 1
        return result

    def _waited(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.summary_waits.labels(outcome).inc()

    def _count(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        if self.metrics is not None:
            self.metrics.summary_calls.labels(kind).inc()

    async def run_due(self, now: dt.datetime | None = None) -> int:
        """Retry every summary whose back-off has run out; returns how many jobs ran."""
        now = now or self.clock()
        jobs: dict[Job, None] = {}
        for tenant, row in await self.repo.due_summaries(now):
            kind = {"conversation": SUMMARY_JOB, "profile": PROFILE_JOB}.get(row.kind, ARCHIVE_JOB)
            jobs[Job(kind, tenant, row.conversation_id)] = None
        for job in jobs:
            await self._safe_handle(job, now)
        return len(jobs)

    async def sweep_all(self, now: dt.datetime | None = None, enqueue: bool = False) -> int:
        """Archival by age for every conversation holding messages, at once or (``enqueue``) as queued jobs
        that the replicas share; returns how many conversations."""
        now = now or self.clock()
        done, after = 0, ""
        while True:
            page = await self.repo.conversations_with_entries(after)
            if not page:
                return done
            for tenant, conversation_id in page:
                job = Job(ARCHIVE_JOB, tenant, conversation_id)
                if enqueue:
                    await self.queue.put(job)
                else:
                    await self._safe_handle(job, now)
                done += 1
            after = page[-1][1]

    async def tick(self) -> None:
        """One round of the periodic maintenance: due retries (one replica per interval), and once per UTC day
        the archival sweep of every conversation (ages change by the day; one replica enqueues it)."""
        interval = self.config.sweep_interval_s
        if await self.queue.claim("due", 0.9 * interval):
            await self.run_due()
        today = self.clock().date().isoformat()
        if today != self._swept_on:
            if await self.queue.claim(f"sweep:{today}", 2 * 86400):
                await self.sweep_all(enqueue=True)
            self._swept_on = today

    async def _safe_handle(self, job: Job, now: dt.datetime) -> None:
        try:
            await self.handle(job, now)
        except Exception:
            log.exception("background job %s of %s failed", job.kind, job.conversation_id)

    # --- life cycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.queue.run(self.handle), name="memci-memory-jobs"),
            asyncio.create_task(self._periodic(), name="memci-memory-sweep"),
        ]
        if self.local_queue is not None:
            self._tasks += [asyncio.create_task(self.local_queue.run(self.handle), name=f"memci-memory-local-jobs-{i}")
                            for i in range(LOCAL_CONSUMERS)]
        if self.config.idle_s > 0:
            self._tasks.append(asyncio.create_task(self._idle_loop(), name="memci-memory-idle"))

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.idle_s / 4))
            try:
                await self.run_idle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("queueing the jobs of idle conversations failed")

    async def _periodic(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("memory maintenance sweep failed")
            await asyncio.sleep(self.config.sweep_interval_s)

    async def stop(self) -> None:
        for task in [*self._tasks, *self._before]:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        self._before.clear()
        await self.covered.close()
        await self.queue.close()
        if self.local_queue is not None:
            await self.local_queue.close()
        close = getattr(self.summarizer, "aclose", None)
        if close is not None:
            await close()
