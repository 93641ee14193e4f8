"""Where a conversation's state comes from and goes to: this process's newest copy, the shared hot copy, the store.

The durability contract (docs/architecture.md):
(i)  ``save_now``: what leaves the prompt (archived pages with their entries, kept recall exchanges, epoch
     snapshots) is stored in PostgreSQL before the upstream request that omits it; this conversation's queued
     writes go first, in the same order.
(ii) ``save_behind``: per-turn appends are queued after the answer (memci_proxy.turn.writer), batched, with bounded lag.
(iii) after a crash, the last stored snapshot plus the client's resent history rebuild the conversation: the
     engine takes every message past the stored state as new.

Versions and replicas. Every stored snapshot is a compare and set on the state it was planned from (its version and
the md5 of its bytes), so a write never replaces a state it did not build on: a conflict is StaleState, also
without Redis. With Redis, the hot copy holds the newest state (written after each turn, before the session lock
is released), so the next turn on any replica continues from it; its write waits until the write it builds on has
landed (another replica's queue drains within its lag), and past ``behind_wait`` (that replica crashed) the turn is
redone on the stored state. Versions only grow: a new version is above every version this process has seen of the
conversation, so the hot copy's newest-wins rule holds across redone turns.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.engine import ConversationState
from memci_proxy.engine.state import common_prefix_of_blobs
from memci_proxy.metrics import Metrics
from memci_proxy.store.ports import (
    BEHIND,
    NOT_FOUND,
    REPLAYED,
    SAVED,
    ConversationNotFound,
    HotState,
    SnapshotBase,
    SnapshotBehind,
    StaleState,
    snapshot_digest,
)
from memci_proxy.turn.page_index import IndexBehind
from memci_proxy.turn.rows import RowSet
from memci_proxy.turn.writer import Pending, WriteBehind

log = logging.getLogger("memci.turn")
HOT_TTL_S = 24 * 3600.0
NOT_STORED = ""  # the digest of a state not (yet) known to be stored: matches no stored state
# The session lock: the lease (renewed every third of it while held) and the longest wait for a conversation's
# previous request. The wait outlasts the lease, so a crashed holder's lock always expires within one wait.
LOCK_LEASE_S = 15.0
LOCK_WAIT_S = 20.0
# How long a write waits for the write it builds on (queued on another replica, whose lag is bounded) before that
# one counts as lost (a crash) and the turn is planned again on the stored state.
BEHIND_WAIT_S = 2.0

Redo = Callable[[str, str, ConversationState | None, Any], Awaitable[tuple[ConversationState, RowSet]]]


class StoreUnavailable(Exception):
    """The store of truth refused a read or write the turn needs before the upstream call."""


@dataclass(slots=True)
class Known:
    """A conversation's state as this process knows it, and the stored state a write planned from it builds on
    (when nothing of this conversation is queued here)."""

    state: ConversationState | None
    version: int
    base: SnapshotBase
    snapshot: bytes | None = None


def state_size(state: ConversationState) -> int:
    """Estimated bytes of a decoded state (hashes, tokens, page records, texts)."""
    return 6 * len(state.hash_blob) + 2 * (len(state.system_text or "") + len(state.contents_text)) + 512


class ConversationStates:
    def __init__(self, repo: Any, hot: HotState, shared_hot: bool, metrics: Metrics, settings: Any, redo: Redo) -> None:
        self.repo = repo
        self.hot = hot
        self.shared_hot = shared_hot  # Redis: other replicas read the hot copy
        self.metrics = metrics
        self.redo = redo
        self.tips: BoundedLru[str, Known] = BoundedLru(
            "states", settings.state_cache_max_entries, settings.state_cache_max_mb << 20,
            lambda _cid, k: state_size(k.state) if k.state is not None else 64, max_idle_s=settings.state_cache_idle_s)
        self.highest: BoundedLru[str, int] = BoundedLru(
            "state_versions", settings.state_cache_max_entries * 4, 64 << 20, lambda _cid, _v: 64)
        self.writer = WriteBehind(
            repo, metrics, max_lag_s=settings.write_behind_max_lag_ms / 1000, batch=settings.write_behind_batch,
            max_pending=settings.write_behind_max_pending, on_stored=self._stored, on_stale=self._resolve_stale,
            behind_wait_s=BEHIND_WAIT_S,
        )
        # the full-text index of pages stored before the upstream call (page_fulltext)
        self.index = IndexBehind(repo, metrics, enabled=settings.page_fulltext)

    def start(self) -> None:
        self.writer.start()
        self.index.start()

    async def close(self) -> None:
        await self.writer.close()
        await self.index.close()

    # --- reading ---------------------------------------------------------------------------------------------
    async def load(self, tenant: str, conversation_id: str, fresh: bool = False) -> Known:
        """The newest state: this process's (queued or cached), unless the hot copy has a newer one; with
        ``fresh`` (or nothing here) the store of truth's."""
        if not fresh:
            mine = self._mine(conversation_id)
            if self.shared_hot or mine is None:
                newer = await self._hot_newer(conversation_id, mine.version if mine is not None else -1)
                if newer is not None:
                    return newer
            if mine is not None:
                return mine
        try:
            stored = await self.repo.load_snapshot(tenant, conversation_id)
        except Exception as exc:
            log.warning("could not load conversation %s from the database: %s", conversation_id, exc)
            raise StoreUnavailable(str(exc)) from exc
        if stored is None or stored[0] is None:
            return Known(None, 0, SnapshotBase(0, None))
        known = Known(ConversationState.from_bytes(stored[0]), stored[1], SnapshotBase(stored[1], snapshot_digest(stored[0])),
                      stored[0])
        self._remember(conversation_id, known)
        return known

    def _mine(self, conversation_id: str) -> Known | None:
        pending = self.writer.newest(conversation_id)
        tip = self.tips.get(conversation_id)
        if pending is not None and (tip is None or pending.version >= tip.version):
            return Known(pending.state, pending.version, SnapshotBase(pending.version, NOT_STORED), pending.snapshot)
        return tip

    async def _hot_newer(self, conversation_id: str, version: int) -> Known | None:
        try:
            found = await self.hot.get_snapshot(conversation_id, version)
        except Exception as exc:
            log.warning("hot state unreachable for %s (%s)", conversation_id, exc)
            return None
        if found is None:
            return None
        try:
            state = ConversationState.from_bytes(found[0])
        except Exception:  # an unreadable hot copy (another version, corruption): the database's instead
            log.exception("conversation %s: unreadable hot snapshot; loading it from the database", conversation_id)
            self.metrics.engine_errors.labels("hot_snapshot").inc()
            return None
        known = Known(state, found[1], SnapshotBase(found[1], snapshot_digest(found[0])), found[0])
        self._remember(conversation_id, known)
        return known

    def state_of(self, conversation_id: str) -> ConversationState | None:
        mine = self._mine(conversation_id)
        return mine.state if mine is not None else None

    def next_version(self, conversation_id: str, planned_from: int) -> int:
        """Above every version of the conversation this process has seen."""
        return max(planned_from, self.highest.get(conversation_id) or 0) + 1

    def _remember(self, conversation_id: str, known: Known) -> None:
        self.tips.put(conversation_id, known)
        if known.version > (self.highest.get(conversation_id) or 0):
            self.highest.put(conversation_id, known.version)

    async def forget(self, conversation_id: str) -> None:
        self.tips.pop(conversation_id)
        self.index.forget(conversation_id)
        await self.writer.take(conversation_id)

    # --- writing ---------------------------------------------------------------------------------------------
    async def save_now(self, tenant: str, conversation_id: str, known: Known, state: ConversationState,
                       rows: RowSet, index_behind: bool = False) -> Known:
        """Store now (before the upstream call that omits something). Raises StaleState (SnapshotBehind when
        the stored state is older than the one planned from), ConversationNotFound, or the store's error.
        ``index_behind``: the pages leaving 'active' are stored without their full-text index, made after the
        answer (``index``; an epoch's write)."""
        queued = await self.writer.take(conversation_id)
        if queued and queued[-1].version != known.version:  # not planned from them: written first, in order
            self.writer.give_back(conversation_id, queued)
            queued = []
            if not await self.writer.settle(conversation_id):
                raise StaleState(f"conversation {conversation_id}: queued turns no longer apply to the stored state")
        # The turns queued here, planned on, go in the same write (one statement): their rows, then this turn's,
        # compared and set on the stored state the oldest of them builds on.
        base = queued[0].base if queued else self._base(conversation_id, known)
        if queued:
            merged = RowSet()
            for p in queued:
                merged.merge(p.rows)
            merged.merge(rows)
            rows = merged
        version = self.next_version(conversation_id, known.version)
        snapshot = state.to_bytes()
        index_behind = index_behind and (self.index.enabled or not self.index.wanted)  # (not wanted: never indexed)
        write = rows.write(tenant, conversation_id, snapshot, version, base, index_behind=index_behind)
        try:
            outcome = await self.writer.save_waiting(write)
        except BaseException:
            self.writer.give_back(conversation_id, queued)
            raise
        if outcome in (SAVED, REPLAYED):
            self.writer.stored_with(queued)
            if index_behind:
                self.index.stored(tenant, conversation_id, (p.number for p in write.pages if p.state != "active"))
        elif queued and outcome != NOT_FOUND:  # the queued turns no longer apply to the stored state (dropped)
            raise StaleState(f"conversation {conversation_id}: queued turns no longer apply to the stored state")
        if outcome == BEHIND:
            raise SnapshotBehind(f"conversation {conversation_id}: the state version {known.version} was planned "
                                 "from is not stored yet")
        if outcome == NOT_FOUND:
            raise ConversationNotFound(conversation_id)
        if outcome not in (SAVED, REPLAYED):
            raise StaleState(f"conversation {conversation_id}: another state is stored than version {known.version}")
        stored = Known(state, version, SnapshotBase(version, snapshot_digest(snapshot)), snapshot)
        self._remember(conversation_id, stored)
        await self._put_fingerprints(tenant, conversation_id, rows)
        return stored

    async def save_behind(self, tenant: str, conversation_id: str, known: Known, state: ConversationState,
                          rows: RowSet, redo: Any) -> Known:
        """Queue the turn's rows behind the answer; the hot copy and fingerprints are updated now, so the next turn
        on any replica continues from this state."""
        version = self.next_version(conversation_id, known.version)
        snapshot = state.to_bytes() if self.shared_hot else None
        await self.writer.append(tenant, conversation_id, known.version, self._base(conversation_id, known), state,
                                 version, rows, redo, snapshot)
        newest = Known(state, version, SnapshotBase(version, NOT_STORED), snapshot)
        self._remember(conversation_id, newest)
        if snapshot is not None:
            await self._put_hot(conversation_id, snapshot, version)
        await self._put_fingerprints(tenant, conversation_id, rows)
        return newest

    def _base(self, conversation_id: str, known: Known) -> SnapshotBase:
        """The stored state a write planned from ``known`` builds on: when ``known`` was queued here, its write may
        have landed since (the cached copy learns the stored digest then)."""
        if known.base.digest == NOT_STORED:
            tip = self.tips.get(conversation_id)
            if tip is not None and tip.version == known.version and tip.base.digest != NOT_STORED:
                return tip.base
        return known.base

    async def _put_hot(self, conversation_id: str, snapshot: bytes, version: int) -> None:
        try:
            await self.hot.put_snapshot(conversation_id, snapshot, version, HOT_TTL_S)
        except Exception as exc:
            log.warning("could not update the hot copy of %s: %s", conversation_id, exc)

    async def _put_fingerprints(self, tenant: str, conversation_id: str, rows: RowSet) -> None:
        if not rows.fingerprints:
            return
        items = [(h, conversation_id, n) for h, n in rows.newest_fingerprints()]
        try:
            await self.hot.put_fingerprints(tenant, items, HOT_TTL_S)
        except Exception as exc:
            log.warning("could not cache the fingerprints of %s: %s", conversation_id, exc)

    # --- what the writer reports ------------------------------------------------------------------------------
    def _stored(self, conversation_id: str, version: int, base: SnapshotBase) -> None:
        tip = self.tips.get(conversation_id)
        if tip is not None and tip.version == version:
            tip.base = base

    async def _resolve_stale(self, pendings: list[Pending]) -> None:
        """Another state is stored than the queued turns build on: under the session lock, their newest turn goes on
        top of the stored state."""
        cid = pendings[0].conversation_id
        async with self.hot.lock(cid, LOCK_WAIT_S, LOCK_LEASE_S):
            pendings += await self.writer.take(cid)
            newest = max(pendings, key=lambda p: p.version)
            await self.redo_on_stored(newest.tenant, cid, newest.state, newest.redo, newest.version)

    async def redo_on_stored(self, tenant: str, conversation_id: str, state: ConversationState, redo: Any,
                             version: int = 0) -> None:
        """The caller holds the session lock. When the stored state holds every message of ``state`` already, it
        becomes this process's copy; else the turn ``redo`` describes is planned again on it (the client's history
        is in it) and stored over it."""
        cid = conversation_id
        self.metrics.engine_errors.labels("stale_state").inc()
        log.warning("conversation %s: another state was stored meanwhile; the last turn goes on top of it", cid)
        for _ in range(3):
            stored = await self.load(tenant, cid, fresh=True)
            if stored.state is not None and _holds(stored.state, state):
                return
            new_state, rows = await self.redo(tenant, cid, stored.state, redo)
            new_version = self.next_version(cid, max(stored.version, version))
            snapshot = new_state.to_bytes()
            outcome = (await self.repo.save_turns([rows.write(tenant, cid, snapshot, new_version, stored.base)]))[0]
            if outcome == NOT_FOUND:
                return
            if outcome in (SAVED, REPLAYED):
                self._remember(cid, Known(new_state, new_version, SnapshotBase(new_version, snapshot_digest(snapshot)),
                                          snapshot))
                if self.shared_hot:
                    await self._put_hot(cid, snapshot, new_version)
                return
        raise StaleState(f"conversation {cid}: the stored state kept changing")


def _holds(stored: ConversationState, mine: ConversationState) -> bool:
    """Whether the stored state holds every message of ``mine`` (the same entries, in order)."""
    return (stored.entry_count >= mine.entry_count
            and common_prefix_of_blobs(stored.hash_blob, mine.hash_blob) >= mine.entry_count)
