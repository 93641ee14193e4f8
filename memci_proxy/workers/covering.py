"""What an epoch takes from the memory workers into the prompt: the conversation's summary (B4) and its own profile
(B2a) as they stand once the jobs have taken in every page archived *before* that epoch.

A job's result enters the prompt at a point fixed by the conversation's history, never by the moment the job
finished or by the process that asks: at an epoch planned from a state whose archived pages end at message
``through`` (``archived_through``), the summary and profile rows must have taken in at least that far (their
``last_seq``); the text they then hold is the same on every replica. When they have not yet (the previous epoch's
jobs still running), the epoch waits for them, at most ``summary_wait_s``; if they are still behind, or backing off
after a failure, the epoch keeps the summary and profile the state already shows.

The values are cached per process by how far they cover (immutable for a coverage), so a replica reads PostgreSQL
only while the jobs it waits for are not done; no time to live decides what a prompt holds.

An end user's profile (a user id: facts from all their conversations) is read as before (``latest_profile``), at
the same points: which other conversations' jobs have finished is not part of this conversation's history.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.engine.state import ConversationState
from memci_proxy.workers.summaries import render_profile

log = logging.getLogger("memci.workers")
POLL_FIRST_S = 0.05  # (a job of this process wakes the wait at once: the polls are for other replicas' jobs)
POLL_MAX_S = 0.5
BEHIND_RECHECK_S = 1.0  # a turn asks PostgreSQL again this long after it found the jobs behind (epochs always ask)
FAILED_RECHECK_S = 30.0  # after it found them backing off


@dataclass(frozen=True)
class Covered:
    summary: str
    profile: str


def archived_through(state: ConversationState | None) -> int:
    """The last message (seq) of the pages the state has archived; -1 when none: the end of the page before the
    first active one (pages tile the messages in order, the active ones last: the engine's invariants,
    tests/unit/engine/engine_checks.py), not a pass over every page (a turn's work does not grow with the history)."""
    if state is None or state.first_active_page == 0 or not state.pages:
        return -1
    return state.pages[min(state.first_active_page, len(state.pages)) - 1].end - 1


def _covers(row: Any) -> int:
    return row.last_seq if row is not None and row.status == "done" else -1


def _backing_off(row: Any, now: dt.datetime) -> bool:
    return row is not None and row.next_attempt_at is not None and row.next_attempt_at > now


class CoveredMemory:
    """The summary and the conversation's own profile by coverage, cached per process (bounded)."""

    def __init__(self, repo: Any, max_facts: int,
                 user_profile: Callable[[str, str, str], Awaitable[str]],
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.repo, self.max_facts, self.user_profile, self.clock = repo, max_facts, user_profile, clock
        self.on_wait = on_wait  # told each wait's outcome (memci_summary_waits)
        self._cache: BoundedLru[tuple[str, str], tuple[int, Covered]] = BoundedLru(
            "covered_memory", 10_000, 48 * 2**20,
            size_of=lambda k, v: 200 + len(k[0]) + len(k[1]) + len(v[1].summary) + len(v[1].profile))
        # conversations whose jobs were found behind: (through, monotonic time to ask again); only turns that make no
        # epoch use it (what they plan does not depend on it), so it saves reads, never changes a prompt
        self._behind: BoundedLru[tuple[str, str], tuple[int, float]] = BoundedLru(
            "covered_memory_behind", 10_000, 4 * 2**20, size_of=lambda k, v: 120 + len(k[0]) + len(k[1]))
        self.waits: dict[str, int] = {}  # epochs that waited for the jobs, by outcome ("ready", "behind", "failed")
        # conversation -> the events of the epochs waiting for its jobs (``jobs_ran`` wakes them at once; the poll
        # remains for jobs another replica runs)
        self._waiting: dict[tuple[str, str], set[asyncio.Event]] = {}
        # conversation -> the read of what a job that ended in this process left (``jobs_ran``), and whether another
        # job ended while it ran (it reads once more)
        self._refreshing: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._stale: set[tuple[str, str]] = set()

    async def read(self, tenant: str, conversation_id: str, through: int, end_user: str = "") -> Covered | None:
        """The summary and profile covering at least message ``through``; None while the jobs are behind."""
        behind = self._behind.get((tenant, conversation_id))
        if behind is not None and behind[0] == through and time.monotonic() < behind[1]:
            return None
        found = await self._own(tenant, conversation_id, through)
        if found is None or found is _FAILED:
            again = FAILED_RECHECK_S if found is _FAILED else BEHIND_RECHECK_S
            self._behind.put((tenant, conversation_id), (through, time.monotonic() + again))
            return None
        return await self._for_user(found, tenant, conversation_id, end_user)

    async def _for_user(self, found: Covered, tenant: str, conversation_id: str, end_user: str) -> Covered:
        if end_user:
            return Covered(found.summary, await self.user_profile(tenant, conversation_id, end_user))
        return found

    async def wait(self, tenant: str, conversation_id: str, through: int, end_user: str, timeout_s: float
                   ) -> Covered | None:
        """``read``, again until the jobs have covered ``through`` (at most ``timeout_s``; not when they failed): at
        once when a job of the conversation ends in this process (``jobs_ran``), else at growing intervals."""
        deadline, pause = time.monotonic() + timeout_s, POLL_FIRST_S
        key = (tenant, conversation_id)
        woken = asyncio.Event()
        self._waiting.setdefault(key, set()).add(woken)
        try:
            while True:
                woken.clear()  # before the read: a job ending after it wakes the wait below
                found = await self._own(tenant, conversation_id, through)
                if found is _FAILED:
                    self._count("failed")
                    return None
                if found is not None:
                    self._count("ready")
                    return await self._for_user(found, tenant, conversation_id, end_user)
                left = deadline - time.monotonic()
                if left <= 0:
                    self._count("behind")
                    return None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(woken.wait(), min(pause, left))
                pause = min(POLL_MAX_S, pause * 2)
        finally:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.discard(woken)
                if not waiting:
                    del self._waiting[key]

    def jobs_ran(self, tenant: str, conversation_id: str) -> None:
        """A summary or profile job of the conversation ended in this process: the epochs waiting read again now;
        with none waiting, what the jobs cover is read behind the turns (``_refresh``), so that the next epoch finds
        it cached instead of waiting for a read, and the turns between stop finding the jobs behind."""
        key = (tenant, conversation_id)
        waiting = self._waiting.get(key)
        if waiting:
            for woken in waiting:
                woken.set()
            return
        if key in self._refreshing:
            self._stale.add(key)  # read again once the read under way ends (it may predate this job's rows)
            return
        task = asyncio.get_running_loop().create_task(self._refresh(key))
        self._refreshing[key] = task
        task.add_done_callback(lambda done: self._refreshing.pop(key) if self._refreshing.get(key) is done else None)

    async def _refresh(self, key: tuple[str, str]) -> None:
        """What the conversation's summary and profile rows cover now, cached as an epoch's read caches it; the
        mark of jobs found behind goes once they cover what it was set for."""
        tenant, conversation_id = key
        try:
            while True:
                self._stale.discard(key)
                behind = self._behind.peek(key)  # (through, when to ask again): the coverage the mark waits for
                through = max(0, behind[0]) if behind is not None else 0
                found = await self._own(tenant, conversation_id, through)
                if found is not None and found is not _FAILED:
                    self._behind.pop(key)
                if key not in self._stale:
                    return
        except Exception as exc:  # the next epoch reads (and waits) as before
            log.debug("could not read the memory jobs' progress for %s: %s", conversation_id, exc)
        finally:
            self._stale.discard(key)

    async def close(self) -> None:
        """The reads under way cancelled (nothing waits for them)."""
        tasks = list(self._refreshing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def forget(self, tenant: str, conversation_id: str) -> None:
        refreshing = self._refreshing.pop((tenant, conversation_id), None)
        if refreshing is not None:
            refreshing.cancel()  # a deleted conversation's rows are not cached again
        self._cache.pop((tenant, conversation_id))
        self._behind.pop((tenant, conversation_id))

    def _count(self, outcome: str) -> None:
        self.waits[outcome] = self.waits.get(outcome, 0) + 1
        if self.on_wait is not None:
            self.on_wait(outcome)

    async def _own(self, tenant: str, conversation_id: str, through: int) -> Covered | None:
        if through < 0:
            return EMPTY
        key = (tenant, conversation_id)
        cached = self._cache.get(key)
        if cached is not None and cached[0] >= through:
            return cached[1]
        summary = await self.repo.get_summary(tenant, conversation_id, "conversation")
        profile = await self.repo.get_summary(tenant, conversation_id, "profile")
        covers = min(_covers(summary), _covers(profile))
        if covers < through:
            now = self.clock()
            return _FAILED if _backing_off(summary, now) or _backing_off(profile, now) else None
        facts = await self.repo.profile_facts(tenant, conversation_id, "", self.max_facts)
        found = Covered(summary.text if summary is not None else "", render_profile(facts))
        self._cache.put(key, (covers, found))
        return found


EMPTY = Covered("", "")
_FAILED = Covered("\0failed", "")  # a sentinel: the jobs are backing off, waiting is pointless
