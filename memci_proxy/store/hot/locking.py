"""The session lock as a lease: take it with a bounded wait, renew it while held, release it by token.

Backends (Redis, in-process) provide the four primitives; ``hold_lease`` composes them into the
async context manager HotState.lock returns. A holder that dies stops renewing, and its lease
expires lease_s later, so one crashed replica never blocks a conversation for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import AsyncIterator
from typing import Protocol

from memci_proxy.store.ports import LockTimeout

logger = logging.getLogger("memci.store")

FIRST_BACKOFF_S = 0.002
MAX_BACKOFF_S = 0.05


class LeaseBackend(Protocol):
    async def try_acquire(self, conversation_id: str, token: str, lease_s: float) -> bool: ...

    async def renew(self, conversation_id: str, token: str, lease_s: float) -> bool: ...

    async def release(self, conversation_id: str, token: str) -> bool: ...

    async def wait_for_release(self, conversation_id: str, backoff_s: float, remaining_s: float) -> None:
        """Return when the lock may have become free: at the latest after remaining_s; a backend
        that cannot be told of releases sleeps backoff_s (<= remaining_s) and lets the caller retry."""


def new_token() -> str:
    return secrets.token_hex(16)


async def acquire_lease(backend: LeaseBackend, conversation_id: str, timeout_s: float, lease_s: float) -> str:
    """Take the lock, waiting at most timeout_s; returns the owner token. Raises LockTimeout."""
    token = new_token()
    deadline = time.monotonic() + max(timeout_s, 0.0)
    backoff = FIRST_BACKOFF_S
    while True:
        if await backend.try_acquire(conversation_id, token, lease_s):
            return token
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise LockTimeout(f"conversation {conversation_id}: lock not free after {timeout_s:.3g}s")
        jittered = backoff * (0.5 + random.random())
        await backend.wait_for_release(conversation_id, min(remaining, jittered), remaining)
        backoff = min(backoff * 2, MAX_BACKOFF_S)


class _Renewer:
    """Renews a held lease every third of it, on the event loop's timer (no task while nothing is due: most turns
    end long before the first renewal)."""

    def __init__(self, backend: LeaseBackend, conversation_id: str, token: str, lease_s: float) -> None:
        self.backend, self.conversation_id, self.token, self.lease_s = backend, conversation_id, token, lease_s
        self.interval = max(lease_s / 3.0, 0.001)
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task[None] | None = None
        self.handle: asyncio.TimerHandle | None = self.loop.call_later(self.interval, self._due)

    def _due(self) -> None:
        self.handle = None
        self.task = self.loop.create_task(self._renew())

    async def _renew(self) -> None:
        try:
            still_ours = await self.backend.renew(self.conversation_id, self.token, self.lease_s)
        except Exception:  # noqa: BLE001 - a failed renewal is retried next interval
            logger.warning("conversation %s: lock renewal failed", self.conversation_id, exc_info=True)
            still_ours = True
        if not still_ours:
            logger.error("conversation %s: lock lost (lease expired before renewal)", self.conversation_id)
            return
        self.handle = self.loop.call_later(self.interval, self._due)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        if self.task is not None:
            self.task.cancel()  # not awaited: a renewal racing the release finds the token gone and stops


@contextlib.asynccontextmanager
async def hold_lease(
    backend: LeaseBackend, conversation_id: str, timeout_s: float = 30.0, lease_s: float = 60.0
) -> AsyncIterator[None]:
    token = await acquire_lease(backend, conversation_id, timeout_s, lease_s)
    renewer = _Renewer(backend, conversation_id, token, lease_s)
    try:
        yield
    finally:
        renewer.cancel()
        release_now = getattr(backend, "release_now", None)  # an in-process backend: nothing to wait for
        try:
            if release_now is not None:
                release_now(conversation_id, token)
            else:
                await asyncio.shield(backend.release(conversation_id, token))
        except Exception:  # noqa: BLE001 - the lease expires by itself
            logger.warning("conversation %s: lock release failed; it expires in %.3gs", conversation_id, lease_s)
