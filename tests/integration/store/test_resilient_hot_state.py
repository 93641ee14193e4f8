"""ResilientHotState: Redis when it answers, in-process state and locks while it does not."""

from __future__ import annotations

import asyncio
import socket

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from memci_proxy.store.hot.redis import RedisHotState
from memci_proxy.store.hot.resilient import ResilientHotState
from memci_proxy.store.ports import HotState, LockTimeout
from tests.manual_clock import ManualClock

CID = "conversation-1"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_redis_down_falls_back_to_in_process_state() -> None:
    hot = ResilientHotState(RedisHotState(f"redis://127.0.0.1:{closed_port()}/0", connect_timeout_s=0.2))
    try:
        assert isinstance(hot, HotState)
        assert not await hot.ping()
        await hot.put_snapshot(CID, b"s", 1, ttl_s=60)
        assert hot.degraded and hot.outages == 1
        assert await hot.get_snapshot(CID) == (b"s", 1)
        await hot.put_fingerprints("t", [("h", CID, 1)], ttl_s=60)
        assert await hot.get_fingerprint("t", "h") == (CID, 1)
        async with hot.lock(CID, timeout_s=1, lease_s=5):
            with pytest.raises(LockTimeout):
                async with hot.lock(CID, timeout_s=0.05):
                    pass
        await hot.delete_conversation(CID)
        assert await hot.get_snapshot(CID) is None
    finally:
        await hot.close()


async def test_two_replicas_exclude_each_other_through_redis(redis_url: str) -> None:
    replica_a = ResilientHotState(RedisHotState(redis_url))
    replica_b = ResilientHotState(RedisHotState(redis_url))
    try:
        async with replica_a.lock(CID, timeout_s=1, lease_s=5):
            with pytest.raises(LockTimeout):
                async with replica_b.lock(CID, timeout_s=0.1, lease_s=5):
                    pass
        async with replica_b.lock(CID, timeout_s=1, lease_s=5):
            pass
        await replica_a.put_snapshot(CID, b"shared", 2, ttl_s=60)
        assert await replica_b.get_snapshot(CID) == (b"shared", 2)
        assert not replica_a.degraded and not replica_b.degraded
    finally:
        await replica_a.close()
        await replica_b.close()


async def test_an_outage_is_retried_after_a_while_and_recovers(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(1000.0)
    primary = RedisHotState(redis_url)
    hot = ResilientHotState(primary, retry_after_s=5.0, clock=clock)
    calls = 0

    async def failing_get_snapshot(conversation_id: str, newer_than: int = -1) -> None:
        nonlocal calls
        calls += 1
        raise RedisConnectionError("connection refused")

    try:
        await primary.put_snapshot(CID, b"in-redis", 1, ttl_s=60)
        with monkeypatch.context() as patch:
            patch.setattr(primary, "get_snapshot", failing_get_snapshot)
            assert await hot.get_snapshot(CID) is None  # a miss: the caller rebuilds from PostgreSQL
            assert await hot.get_snapshot(CID) is None
            assert calls == 1  # Redis not asked again within retry_after_s
            assert hot.degraded
        clock.now += 5.0
        assert await hot.get_snapshot(CID) == (b"in-redis", 1)
        assert not hot.degraded
    finally:
        await hot.close()


async def test_lock_stays_exclusive_within_a_replica_while_redis_goes_down(redis_url: str) -> None:
    clock = ManualClock(1000.0)
    hot = ResilientHotState(RedisHotState(redis_url), clock=clock)
    try:
        async with hot.lock(CID, timeout_s=1, lease_s=5):  # held on Redis and in-process
            hot._mark_down(RedisConnectionError("gone"))  # Redis disappears meanwhile
            with pytest.raises(LockTimeout):
                async with hot.lock(CID, timeout_s=0.05):
                    pass
        await asyncio.sleep(0)
    finally:
        await hot.close()


async def test_a_snapshot_written_during_an_outage_wins_over_the_older_redis_copy(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(1000.0)
    primary = RedisHotState(redis_url)
    hot = ResilientHotState(primary, retry_after_s=5.0, clock=clock)

    async def refused(*args: object, **kwargs: object) -> None:
        raise RedisConnectionError("connection refused")

    try:
        await hot.put_snapshot(CID, b"v1", 1, ttl_s=60)
        with monkeypatch.context() as patch:
            patch.setattr(primary, "put_snapshot", refused)
            await hot.put_snapshot(CID, b"v2", 2, ttl_s=60)  # lands in-process only
        clock.now += 5.0
        assert await hot.get_snapshot(CID) == (b"v2", 2)
        assert await primary.get_snapshot(CID) == (b"v1", 1)
        await hot.put_snapshot(CID, b"v3", 3, ttl_s=60)  # Redis back: the local copy is dropped
        await primary.client.flushdb()
        assert await hot.get_snapshot(CID) is None  # a miss (rebuilt from PostgreSQL), never the old v2
    finally:
        await hot.close()
