"""Token bucket arithmetic on an injected clock, stream slots, the bounded upstream queue."""

import asyncio

import pytest

from memci_proxy.api.limits import Limits, LocalBuckets, UpstreamGate, bucket_size, take_token
from memci_proxy.settings import Settings
from memci_proxy.wire.errors import ProxyError
from tests.manual_clock import ManualClock


def test_take_token_refills_at_the_rate_up_to_the_burst():
    allowed, tokens, wait = take_token(0.0, 0.0, 0.5, rate=2.0, burst=5.0)
    assert allowed and tokens == pytest.approx(0.0)
    allowed, tokens, wait = take_token(0.0, 0.0, 0.25, rate=2.0, burst=5.0)
    assert not allowed and tokens == pytest.approx(0.5) and wait == pytest.approx(0.25)
    allowed, tokens, _ = take_token(1.0, 0.0, 100.0, rate=2.0, burst=5.0)
    assert allowed and tokens == pytest.approx(4.0)  # capped at the burst before taking


def test_bucket_size_defaults_to_the_rate_rounded_up():
    assert bucket_size(0.5, 0) == 1 and bucket_size(2.5, 0) == 3 and bucket_size(2.5, 10) == 10


def test_local_buckets_burst_then_rate_per_tenant():
    clock = ManualClock(1000.0)
    buckets = LocalBuckets(rate=1.0, burst=3.0, clock=clock)
    assert [buckets.take("a")[0] for _ in range(4)] == [True, True, True, False]
    assert buckets.take("b")[0]  # another tenant has its own bucket
    allowed, wait = buckets.take("a")
    assert not allowed and wait == pytest.approx(1.0)
    clock.now += 1.0
    assert buckets.take("a")[0] and not buckets.take("a")[0]


async def test_rate_limit_raises_429_with_retry_after():
    clock = ManualClock(1000.0)
    limits = Limits(Settings(rate_limit_rps=0.5, rate_limit_burst=1), clock=clock)
    await limits.check_rate("t")
    with pytest.raises(ProxyError) as info:
        await limits.check_rate("t")
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "2"
    assert info.value.code == "rate_limit_exceeded" and info.value.type == "rate_limit_error"
    clock.now += 2.0
    await limits.check_rate("t")


async def test_stream_slots_per_tenant():
    limits = Limits(Settings(max_concurrent_streams_per_tenant=2))
    first = await limits.acquire_stream("t")
    await limits.acquire_stream("t")
    with pytest.raises(ProxyError) as info:
        await limits.acquire_stream("t")
    assert info.value.status == 429 and "Retry-After" in info.value.headers
    await limits.acquire_stream("u")
    first()
    await limits.acquire_stream("t")


def test_message_count_limit():
    limits = Limits(Settings(max_messages=2))
    limits.check_messages({"messages": [{}, {}]})
    with pytest.raises(ProxyError) as info:
        limits.check_messages({"messages": [{}, {}, {}]})
    assert info.value.status == 400 and info.value.param == "messages"


async def test_gate_hands_slots_over_in_order_and_times_out():
    gate = UpstreamGate(limit=1, max_queue=1, timeout=5.0)
    assert await gate.acquire() is None
    waiter = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0)
    assert gate.waiting == 1
    assert await gate.acquire() == "upstream_queue_full"  # the queue holds one
    gate.release()
    assert await waiter is None and gate.inflight == 1
    gate.release()
    assert gate.inflight == 0


async def test_gate_timeout_leaves_no_waiter_behind():
    gate = UpstreamGate(limit=1, max_queue=4, timeout=0.01)
    assert await gate.acquire() is None
    assert await gate.acquire() == "upstream_queue_timeout"
    assert gate.waiting == 0
    gate.release()
    assert gate.inflight == 0 and await gate.acquire() is None


async def test_gate_cancelled_waiter_gives_its_place_back():
    gate = UpstreamGate(limit=1, max_queue=4, timeout=5.0)
    await gate.acquire()
    task = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.release()
    assert gate.inflight == 0


async def test_limits_in_redis_are_shared_by_two_processes_views(redis_url):
    one = Limits(Settings(redis_url=redis_url, rate_limit_rps=0.01, rate_limit_burst=2,
                          max_concurrent_streams_per_tenant=1))
    two = Limits(Settings(redis_url=redis_url, rate_limit_rps=0.01, rate_limit_burst=2,
                          max_concurrent_streams_per_tenant=1))
    try:
        await one.check_rate("t")
        await two.check_rate("t")
        with pytest.raises(ProxyError) as info:
            await one.check_rate("t")
        assert int(info.value.headers["Retry-After"]) >= 90
        release = await one.acquire_stream("t")
        with pytest.raises(ProxyError):
            await two.acquire_stream("t")
        await release()
        await two.acquire_stream("t")
        assert one.backend_errors._value.get() == 0
    finally:
        await one.close()
        await two.close()


async def test_redis_down_falls_back_to_in_process_limits():
    limits = Limits(Settings(redis_url="redis://127.0.0.1:1/0", rate_limit_rps=1, rate_limit_burst=1))
    try:
        await limits.check_rate("t")
        with pytest.raises(ProxyError):
            await limits.check_rate("t")
        assert limits.backend_errors._value.get() == 2
    finally:
        await limits.close()


async def test_gate_timeouts_leave_nothing_queued():
    gate = UpstreamGate(limit=1, max_queue=8, timeout=0.001)
    await gate.acquire()
    for _ in range(20):
        assert await gate.acquire() == "upstream_queue_timeout"
    assert len(gate._waiters) == 0
