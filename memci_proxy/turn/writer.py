"""Write-behind of the per-turn appends: batched, bounded lag, back-pressure, everything written at shutdown.

After the answer, a turn's rows and its newest state are queued here (DESIGN.md section 3: per-turn appends the
client will resend anyway are written behind the answer). Turns of one conversation coalesce into one write: the
newest snapshot with every row since the stored state it builds on. Up to ``batch`` conversations go to PostgreSQL
in one transaction, at the latest ``max_lag_s`` after the oldest of them was queued. Past ``max_pending`` queued
conversations, a new one waits for room (at most ``max_wait_s``): a slow store slows the answers down instead of
growing the queue without bound. ``close`` writes whatever is queued.

Each write is a compare and set on the stored state it was planned from (SnapshotBase). Outcomes:
- saved or replayed: done; ``on_stored`` tells the owner the stored version and digest.
- behind: the write it builds on (another replica's, or one a crash lost) has not landed: tried again until
  ``behind_wait_s`` has passed, then handled as stale.
- stale: another state is stored: the conversation's queued writes go to ``on_stale``, which redoes the newest turn
  on the stored state (or drops them when the stored state holds their messages already).
- not found: the conversation was deleted meanwhile: dropped.
- the store failed: tried again with back-off; the rows stay queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from memci_proxy.engine import ConversationState
from memci_proxy.metrics import Metrics
from memci_proxy.store.ports import (BEHIND, NOT_FOUND, REPLAYED, SAVED, ConversationRepository, SnapshotBase, TurnWrite,
                                     snapshot_digest)
from memci_proxy.turn.rows import RowSet

log = logging.getLogger("memci.turn")


@dataclass(eq=False)
class Pending:
    """One conversation's queued turns, coalesced."""

    tenant: str
    conversation_id: str
    base: SnapshotBase  # the stored state this write applies to
    state: ConversationState  # the newest
    version: int
    rows: RowSet
    redo: Any  # what the owner needs to redo the newest turn on another stored state
    snapshot: bytes | None = None  # the newest state's bytes, once encoded
    digest: str | None = None
    queued_at: float = 0.0  # when its oldest turn was queued
    retry_at: float = 0.0
    behind_since: float | None = None
    failures: int = 0
    urgent: bool = False  # written without waiting for the lag (a read of the database waits for it)

    def encode(self) -> None:
        if self.snapshot is None:
            self.snapshot = self.state.to_bytes()
        if self.digest is None:
            self.digest = snapshot_digest(self.snapshot)


class WriteBehind:
    def __init__(
        self, repo: ConversationRepository, metrics: Metrics, *, max_lag_s: float, batch: int, max_pending: int,
        on_stored: Callable[[str, int, SnapshotBase], None], on_stale: Callable[[list[Pending]], Awaitable[None]],
        behind_wait_s: float = 2.0, max_wait_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repo = repo
        self.metrics = metrics
        self.max_lag_s = max_lag_s
        self.batch = max(1, batch)
        self.max_pending = max(1, max_pending)
        self.behind_wait_s = behind_wait_s
        self.max_wait_s = max_wait_s
        self.on_stored = on_stored
        self.on_stale = on_stale
        self.clock = clock
        self._queues: dict[str, deque[Pending]] = {}  # in order of first queueing
        self._in_flight: dict[str, asyncio.Future[None]] = {}
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._resolving: dict[str, asyncio.Task[None]] = {}  # conversation -> its conflict being resolved
        metrics.writes_pending.set_function(lambda: len(self._queues))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="memci-write-behind")

    # --- what the turn layer calls -------------------------------------------------------------------------
    async def append(self, tenant: str, conversation_id: str, planned_from: int, base: SnapshotBase,
                     state: ConversationState, version: int, rows: RowSet, redo: Any,
                     snapshot: bytes | None = None) -> None:
        """Queue a turn planned from version ``planned_from`` (``base``: the stored state it builds on when nothing
        of this conversation is queued here)."""
        queue = self._queues.get(conversation_id)
        last = queue[-1] if queue else None
        if last is not None and last.version == planned_from and not self._writing(last):
            last.rows.merge(rows)
            last.state, last.version, last.redo, last.snapshot, last.digest = state, version, redo, snapshot, None
            return
        if last is not None and last.version == planned_from:  # being written right now: build on it
            last.encode()
            base = SnapshotBase(last.version, last.digest)
        if queue is None:
            await self._wait_for_room()
            queue = self._queues.setdefault(conversation_id, deque())
        queue.append(Pending(tenant, conversation_id, base, state, version, rows, redo, snapshot,
                             queued_at=self.clock()))
        if len(self._queues) >= self.batch:
            self._wake.set()
        elif len(self._queues) == 1 and len(queue) == 1:
            self._wake.set()  # the flusher sleeps until something is queued

    def newest(self, conversation_id: str) -> Pending | None:
        queue = self._queues.get(conversation_id)
        return queue[-1] if queue else None

    async def settle(self, conversation_id: str) -> bool:
        """Write this conversation's queued turns now, in order (the caller holds its session lock); a write whose
        base has not landed yet (queued on another replica) is waited for, at most ``behind_wait_s``. False when
        they no longer apply to the stored state (they are dropped: the caller plans again from the stored state,
        with the client's resent history)."""
        pendings = await self.take(conversation_id)
        for i, p in enumerate(pendings):
            p.encode()
            try:
                outcome = await self.save_waiting(p.rows.write(p.tenant, p.conversation_id, p.snapshot, p.version,
                                                               p.base))
            except BaseException:
                self.give_back(conversation_id, pendings[i:])
                raise
            if outcome not in (SAVED, REPLAYED):
                return False
            self._stored(p)
        return True

    async def save_waiting(self, write: TurnWrite) -> str:
        """One write's outcome; while its base is BEHIND (queued on another replica) it is tried again, at most
        ``behind_wait_s``."""
        waited, pause = 0.0, 0.005
        while True:
            outcome = (await self.repo.save_turns([write]))[0]
            if outcome != BEHIND or waited >= self.behind_wait_s:
                return outcome
            await asyncio.sleep(pause)
            waited, pause = waited + pause, min(0.1, pause * 2)

    def give_back(self, conversation_id: str, pendings: list[Pending]) -> None:
        """Queued turns taken by a write that failed: queued again, first (their order kept)."""
        if pendings:
            self._queues.setdefault(conversation_id, deque()).extendleft(reversed(pendings))

    def stored_with(self, pendings: list[Pending]) -> None:
        """Queued turns taken into a newer write of their conversation that was stored (their rows with it)."""
        for p in pendings:
            self.metrics.write_lag.observe(max(0.0, self.clock() - p.queued_at))

    async def flush(self, conversation_id: str, timeout_s: float = 5.0) -> None:
        """Write the conversation's queued turns through the flusher now, and wait until they are written (or
        handed on after a conflict)."""
        waiting = set(map(id, self._queues.get(conversation_id, ())))
        if not waiting and conversation_id not in self._in_flight and conversation_id not in self._resolving:
            return
        for p in self._queues.get(conversation_id, ()):
            p.urgent = True
        self._wake.set()
        deadline = self.clock() + timeout_s
        while self.clock() < deadline and (
                conversation_id in self._in_flight or conversation_id in self._resolving
                or waiting.intersection(map(id, self._queues.get(conversation_id, ())))):
            await asyncio.sleep(0.002)

    async def take(self, conversation_id: str) -> list[Pending]:
        """Every queued turn of the conversation, removed from the queue (after a write in flight finished)."""
        while (flight := self._in_flight.get(conversation_id)) is not None:
            await asyncio.shield(flight)
        pendings = list(self._queues.pop(conversation_id, ()))
        if pendings:
            self._room.set()
        return pendings

    async def close(self, timeout_s: float = 30.0) -> None:
        """Write everything queued (waiting at most ``timeout_s``), then stop."""
        self._closing = True
        self._wake.set()
        deadline = self.clock() + timeout_s
        while (self._queues or self._in_flight or self._resolving) and self.clock() < deadline and self._task:
            if self._task.done():
                break
            await asyncio.sleep(0.01)
        if self._queues:
            log.error("write-behind: %d conversations not written at shutdown (the clients resend their messages)",
                      len(self._queues))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for task in list(self._resolving.values()):
            task.cancel()

    # --- the flusher -----------------------------------------------------------------------------------------
    def _writing(self, p: Pending) -> bool:
        flight = self._in_flight.get(p.conversation_id)
        return flight is not None and self._queues.get(p.conversation_id, (None,))[0] is p

    async def _wait_for_room(self) -> None:
        if len(self._queues) < self.max_pending or self._closing:
            return
        self.metrics.write_waits.inc()
        deadline = self.clock() + self.max_wait_s
        while len(self._queues) >= self.max_pending and self.clock() < deadline:
            self._room.clear()
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), max(0.0, deadline - self.clock()))
        if len(self._queues) >= self.max_pending:
            log.warning("write-behind: %d conversations queued, the store is not keeping up", len(self._queues))

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queues:
                now = self.clock()
                heads = [q[0] for cid, q in self._queues.items() if cid not in self._in_flight]
                due = min((now if p.urgent else p.queued_at + self.max_lag_s for p in heads), default=now)
                ready = [p for p in heads if p.retry_at <= now]
                if not ready or (not self._closing and len(heads) < self.batch and due > now):
                    later = min([due] + [p.retry_at for p in heads if p.retry_at > now], default=now + 0.05)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), max(0.001, later - now))
                    self._wake.clear()
                    continue
                await self._write(ready[: self.batch])

    async def _write(self, picked: list[Pending]) -> None:
        loop = asyncio.get_running_loop()
        for p in picked:
            p.encode()
            self._in_flight[p.conversation_id] = loop.create_future()
        try:
            outcomes = await self.repo.save_turns(
                [p.rows.write(p.tenant, p.conversation_id, p.snapshot, p.version, p.base) for p in picked])
        except Exception as exc:
            log.warning("write-behind: could not store %d conversations (%s); trying again", len(picked), exc)
            self.metrics.store_write_failures.labels("behind").inc()
            now = self.clock()
            for p in picked:
                p.failures += 1
                p.retry_at = now + min(5.0, 0.1 * 2 ** min(p.failures, 6))
            return
        finally:
            for p in picked:
                flight = self._in_flight.pop(p.conversation_id, None)
                if flight is not None and not flight.done():
                    flight.set_result(None)
        self.metrics.write_batches.observe(len(picked))
        for p, outcome in zip(picked, outcomes):
            self._settled(p, outcome)

    def _settled(self, p: Pending, outcome: str) -> None:
        cid = p.conversation_id
        queue = self._queues.get(cid)
        if not queue or queue[0] is not p:
            return  # taken meanwhile by a turn that settles it itself
        if outcome in (SAVED, REPLAYED):
            queue.popleft()
            if not queue:
                del self._queues[cid]
                self._room.set()
            self._stored(p)
            return
        now = self.clock()
        if outcome == BEHIND:
            p.behind_since = p.behind_since if p.behind_since is not None else now
            if now - p.behind_since < self.behind_wait_s:
                p.failures += 1
                p.retry_at = now + min(0.5, 0.02 * 2 ** min(p.failures, 5))
                return
        pendings = list(self._queues.pop(cid))
        self._room.set()
        if outcome == NOT_FOUND:
            log.info("conversation %s was deleted before its last turns were stored", cid)
            return
        task = asyncio.get_running_loop().create_task(self._resolve(pendings))
        self._resolving[cid] = task
        task.add_done_callback(lambda done: self._resolving.pop(cid, None) if self._resolving.get(cid) is done else None)

    async def _resolve(self, pendings: list[Pending]) -> None:
        try:
            await self.on_stale(pendings)
        except Exception as exc:
            # Queued again: tried later (a lock held too long, the store failing), so nothing is dropped.
            log.warning("could not store the turns of %s over the stored state (%s); trying again",
                        pendings[0].conversation_id, exc)
            self.metrics.store_write_failures.labels("stale").inc()
            now = self.clock()
            for p in pendings:
                p.failures += 1
                p.retry_at = now + min(30.0, 0.5 * 2 ** min(p.failures, 6))
                p.behind_since = None
            self._queues.setdefault(pendings[0].conversation_id, deque()).extendleft(reversed(pendings))
            self._wake.set()

    def _stored(self, p: Pending) -> None:
        self.metrics.write_lag.observe(max(0.0, self.clock() - p.queued_at))
        self.on_stored(p.conversation_id, p.version, SnapshotBase(p.version, p.digest))
