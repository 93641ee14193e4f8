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

from proxy.store.ports import LockTimeout

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


async def _keep_renewing(backend: LeaseBackend, conversation_id: str, token: str, lease_s: float) -> None:
    interval = max(lease_s / 3.0, 0.001)
    while True:
        await asyncio.sleep(interval)
        try:
            still_ours = await backend.renew(conversation_id, token, lease_s)
        except Exception:  # noqa: BLE001 - a failed renewal is retried next interval
            logger.warning("conversation %s: lock renewal failed", conversation_id, exc_info=True)
            continue
        if not still_ours:
            logger.error("conversation %s: lock lost (lease expired before renewal)", conversation_id)
            return


@contextlib.asynccontextmanager
async def hold_lease(
    backend: LeaseBackend, conversation_id: str, timeout_s: float = 30.0, lease_s: float = 60.0
) -> AsyncIterator[None]:
    token = await acquire_lease(backend, conversation_id, timeout_s, lease_s)
    renewer = asyncio.create_task(_keep_renewing(backend, conversation_id, token, lease_s))
    try:
        yield
    finally:
        renewer.cancel()  # not awaited: a renewal racing the release finds the token gone and stops
        try:
            await asyncio.shield(backend.release(conversation_id, token))
        except Exception:  # noqa: BLE001 - the lease expires by itself
            logger.warning("conversation %s: lock release failed; it expires in %.3gs", conversation_id, lease_s)
