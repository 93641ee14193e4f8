"""Both HotState adapters (in-process, Redis) pass the same suite."""

from __future__ import annotations

import asyncio

import pytest

from memci_proxy.store.ports import HotState, LockTimeout

CID = "conversation-1"


def test_implements_the_port(hot_state: HotState) -> None:
    assert isinstance(hot_state, HotState)


async def test_ping(hot_state: HotState) -> None:
    assert await hot_state.ping()


async def test_snapshot_round_trip(hot_state: HotState) -> None:
    assert await hot_state.get_snapshot(CID) is None
    payload = bytes(range(256)) * 10  # binary, with zero bytes
    await hot_state.put_snapshot(CID, payload, 3, ttl_s=60)
    assert await hot_state.get_snapshot(CID) == (payload, 3)
    await hot_state.put_snapshot(CID, b"newer", 4, ttl_s=60)
    assert await hot_state.get_snapshot(CID) == (b"newer", 4)


async def test_an_older_snapshot_does_not_replace_a_newer_one(hot_state: HotState) -> None:
    await hot_state.put_snapshot(CID, b"v5", 5, ttl_s=60)
    await hot_state.put_snapshot(CID, b"v4", 4, ttl_s=60)
    assert await hot_state.get_snapshot(CID) == (b"v5", 5)


async def test_snapshots_expire(hot_state: HotState) -> None:
    await hot_state.put_snapshot(CID, b"short-lived", 1, ttl_s=0.05)
    await asyncio.sleep(0.15)
    assert await hot_state.get_snapshot(CID) is None


async def test_fingerprints_are_scoped_by_tenant(hot_state: HotState) -> None:
    await hot_state.put_fingerprints("t1", [("h1", CID, 1), ("h2", CID, 2)], ttl_s=60)
    assert await hot_state.get_fingerprint("t1", "h2") == (CID, 2)
    assert await hot_state.get_fingerprint("t1", "h3") is None
    assert await hot_state.get_fingerprint("t2", "h2") is None


async def test_fingerprints_expire(hot_state: HotState) -> None:
    await hot_state.put_fingerprints("t1", [("h1", CID, 1)], ttl_s=0.05)
    await asyncio.sleep(0.15)
    assert await hot_state.get_fingerprint("t1", "h1") is None


async def test_delete_conversation(hot_state: HotState) -> None:
    await hot_state.put_snapshot(CID, b"s", 1, ttl_s=60)
    await hot_state.put_snapshot("other", b"o", 1, ttl_s=60)
    await hot_state.put_fingerprints("t1", [("h1", CID, 1), ("o1", "other", 1)], ttl_s=60)
    await hot_state.delete_conversation(CID)
    assert await hot_state.get_snapshot(CID) is None
    assert await hot_state.get_fingerprint("t1", "h1") is None
    assert await hot_state.get_snapshot("other") == (b"o", 1)
    assert await hot_state.get_fingerprint("t1", "o1") == ("other", 1)


async def test_lock_mutual_exclusion(hot_state: HotState) -> None:
    inside = 0
    entries = 0

    async def worker() -> None:
        nonlocal inside, entries
        for _ in range(3):
            async with hot_state.lock(CID, timeout_s=10, lease_s=5):
                inside += 1
                entries += 1
                assert inside == 1
                await asyncio.sleep(0.001)
                assert inside == 1
                inside -= 1

    await asyncio.gather(*(worker() for _ in range(8)))
    assert entries == 24


async def test_locks_of_different_conversations_are_independent(hot_state: HotState) -> None:
    async with hot_state.lock("a", timeout_s=1):
        async with hot_state.lock("b", timeout_s=0.1):
            pass


async def test_lock_timeout_raises(hot_state: HotState) -> None:
    async with hot_state.lock(CID, timeout_s=1, lease_s=5):
        with pytest.raises(LockTimeout):
            async with hot_state.lock(CID, timeout_s=0.1, lease_s=5):
                pytest.fail("entered a held lock")


async def test_lock_is_released_on_exit_and_on_error(hot_state: HotState) -> None:
    async with hot_state.lock(CID, timeout_s=1):
        pass
    with pytest.raises(RuntimeError):
        async with hot_state.lock(CID, timeout_s=0):
            raise RuntimeError("boom")
    async with hot_state.lock(CID, timeout_s=0):  # free at once
        pass


async def test_lock_is_released_when_the_holder_is_cancelled(hot_state: HotState) -> None:
    entered = asyncio.Event()

    async def holder() -> None:
        async with hot_state.lock(CID, timeout_s=1, lease_s=5):
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(holder())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with hot_state.lock(CID, timeout_s=0.5):
        pass


async def test_a_crashed_holders_lock_expires(hot_state: HotState) -> None:
    # A holder that took the lease and died: nobody renews or releases it.
    assert await hot_state.try_acquire(CID, "dead-holder", 0.3)  # type: ignore[attr-defined]
    with pytest.raises(LockTimeout):
        async with hot_state.lock(CID, timeout_s=0.05):
            pass
    async with hot_state.lock(CID, timeout_s=3, lease_s=5):
        assert not await hot_state.release(CID, "dead-holder")  # type: ignore[attr-defined]


async def test_renewal_keeps_a_long_holders_lock(hot_state: HotState) -> None:
    lease_s = 0.2
    held = asyncio.Event()
    done = asyncio.Event()

    async def long_holder() -> None:
        async with hot_state.lock(CID, timeout_s=1, lease_s=lease_s):
            held.set()
            await asyncio.sleep(4 * lease_s)  # far past one lease
        done.set()

    task = asyncio.create_task(long_holder())
    await held.wait()
    with pytest.raises(LockTimeout):
        async with hot_state.lock(CID, timeout_s=3 * lease_s, lease_s=lease_s):
            pytest.fail("entered a lock whose holder is alive")
    assert not done.is_set()
    await task
    async with hot_state.lock(CID, timeout_s=0):
        pass
