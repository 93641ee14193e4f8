"""The job queue on a real Redis Stream: XADD, XREADGROUP, XACK, and pending entries reclaimed after a crash."""

from __future__ import annotations

from memci_proxy.workers.queue import PROFILE_JOB, SUMMARY_JOB, Job
from memci_proxy.workers.redis_queue import RedisStreamJobQueue


async def test_jobs_flow_through_the_consumer_group(redis_url: str) -> None:
    producer = RedisStreamJobQueue(redis_url, name="producer")
    consumer = RedisStreamJobQueue(redis_url, name="replica-1", block_ms=100)
    try:
        await consumer.ensure_group()
        await producer.put(Job(SUMMARY_JOB, "t", "c1"))
        await producer.put(Job(PROFILE_JOB, "t", "c1"))
        seen: list[Job] = []

        async def handler(job: Job) -> None:
            seen.append(job)

        assert await consumer.handle(await consumer.read(), handler) == 2
        assert seen == [Job(SUMMARY_JOB, "t", "c1"), Job(PROFILE_JOB, "t", "c1")]
        assert (await consumer.redis.xpending(consumer.stream, consumer.group))["pending"] == 0
        assert await consumer.read(block_ms=10) == []
    finally:
        await producer.close()
        await consumer.close()


async def test_a_crashed_consumers_jobs_are_reclaimed(redis_url: str) -> None:
    crashed = RedisStreamJobQueue(redis_url, name="replica-1", block_ms=100)
    survivor = RedisStreamJobQueue(redis_url, name="replica-2", block_ms=100, min_idle_ms=0)
    try:
        await crashed.ensure_group()
        await crashed.put(Job(SUMMARY_JOB, "t", "c9"))
        taken = await crashed.read()
        assert [job for _, job in taken] == [Job(SUMMARY_JOB, "t", "c9")]
        # replica-1 dies before XACK: the entry stays pending, no other consumer gets it as new.
        assert await survivor.read(block_ms=10) == []
        reclaimed = await survivor.reclaim()
        assert [job for _, job in reclaimed] == [Job(SUMMARY_JOB, "t", "c9")]
        seen: list[Job] = []

        async def handler(job: Job) -> None:
            seen.append(job)
            raise RuntimeError("failures are the store's back-off, not a redelivery")

        await survivor.handle(reclaimed, handler)
        assert seen == [Job(SUMMARY_JOB, "t", "c9")]
        assert (await survivor.redis.xpending(survivor.stream, survivor.group))["pending"] == 0
    finally:
        await crashed.close()
        await survivor.close()


async def test_put_never_raises_when_redis_is_down() -> None:
    queue = RedisStreamJobQueue("redis://127.0.0.1:1/0")
    try:
        await queue.put(Job(SUMMARY_JOB, "t", "c"))
    finally:
        await queue.close()


async def test_periodic_work_is_claimed_by_one_replica(redis_url: str) -> None:
    one = RedisStreamJobQueue(redis_url, name="replica-1")
    two = RedisStreamJobQueue(redis_url, name="replica-2")
    try:
        assert await one.claim("sweep:2026-03-01", 60)
        assert not await two.claim("sweep:2026-03-01", 60)
        assert await two.claim("sweep:2026-03-02", 60)
    finally:
        await one.close()
        await two.close()
