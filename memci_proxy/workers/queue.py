"""Background jobs: what a job is, the queue protocol, and the in-process queue of the embedded default.

A job is a nudge, not a unit of bookkeeping: ``(kind, tenant, conversation_id)``. What is due and how often it
failed lives in PostgreSQL (``memory_summaries``), so a lost or repeated job is harmless: the handler reads
the store and does what is left. The in-process queue drops a job already waiting (same key).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

SUMMARY_JOB = "summary"  # the conversation summary (B4) and the topics of newly archived pages
PROFILE_JOB = "profile"  # the tenant's long-term profile facts (B2a) from newly archived pages
ARCHIVE_JOB = "archive"  # archival by age of one conversation (day / month summaries, limits)
JOB_KINDS = (SUMMARY_JOB, PROFILE_JOB, ARCHIVE_JOB)


@dataclass(frozen=True)
class Job:
    kind: str
    tenant: str
    conversation_id: str

    def fields(self) -> dict[str, str]:
        return {"kind": self.kind, "tenant": self.tenant, "conversation_id": self.conversation_id}

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> "Job":
        return cls(fields["kind"], fields["tenant"], fields["conversation_id"])


Handler = Callable[[Job], Awaitable[None]]


@runtime_checkable
class JobQueue(Protocol):
    kind: str  # "in-process" | "redis"

    async def put(self, job: Job) -> None:
        """Enqueue; never raises for a full or unreachable queue (the periodic sweep catches up)."""

    async def run(self, handler: Handler) -> None:
        """Consume until cancelled: call ``handler`` for each job; a job whose handler raised is still
        acknowledged (its retry is the store's back-off, not a redelivery)."""

    async def claim(self, name: str, ttl_s: float) -> bool:
        """True for one caller among the replicas per ``name`` within ``ttl_s`` (periodic work done once)."""

    async def close(self) -> None: ...


class InProcessJobQueue:
    """An asyncio queue with one waiting job per key (one replica only)."""

    kind = "in-process"

    def __init__(self, maxsize: int = 10_000) -> None:
        self._queue: asyncio.Queue[Job] = asyncio.Queue(maxsize)
        self._waiting: set[Job] = set()
        self._taken: set[Job] = set()  # waiting jobs a caller runs itself: skipped when they come out of the queue
        self.dropped = 0

    async def put(self, job: Job) -> None:
        if job in self._waiting:
            return
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.dropped += 1
            return
        self._waiting.add(job)

    def pending(self) -> int:
        return self._queue.qsize()

    async def get(self) -> Job:
        while True:
            job = await self._queue.get()
            if job in self._taken:
                self._taken.discard(job)
                continue
            self._waiting.discard(job)
            return job

    def take(self, job: Job) -> bool:
        """The job, waiting here, is the caller's to run now (an epoch waits for it): True when it was waiting."""
        if job not in self._waiting:
            return False
        self._waiting.discard(job)
        self._taken.add(job)
        return True

    async def drain(self, handler: Handler) -> int:
        """Handle every job waiting now (tests, shutdown); returns how many."""
        done = 0
        while not self._queue.empty():
            job = await self.get()
            await _safely(handler, job)
            done += 1
        return done

    async def run(self, handler: Handler) -> None:
        while True:
            job = await self.get()
            await _safely(handler, job)

    async def claim(self, name: str, ttl_s: float) -> bool:
        return True  # one replica only

    async def close(self) -> None:
        return None


async def _safely(handler: Handler, job: Job) -> None:
    import logging

    try:
        await handler(job)
    except asyncio.CancelledError:
        raise
    except Exception:
        logging.getLogger("memci.workers").exception("background job %s of %s failed", job.kind, job.conversation_id)
