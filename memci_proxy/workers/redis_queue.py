"""The job queue on a Redis Stream with a consumer group (several replicas share the work).

``put``: XADD (length capped, approximate). ``run``: XREADGROUP ``>`` as consumer ``name`` of the group; after the
handler, XACK. A replica that crashed leaves its jobs pending: every ``reclaim_every_s`` the consumer takes over
entries idle for more than ``min_idle_ms`` (XAUTOCLAIM) and handles them. The stream key has a hash tag so it
lives on one slot of a Redis Cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from memci_proxy.workers.queue import Handler, Job, _safely

log = logging.getLogger("memci.workers")

STREAM_KEY = "{memci:jobs}:stream"
GROUP = "memci-workers"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """(entry id, fields) from an XREADGROUP reply (RESP2 list or RESP3 dict) or an XAUTOCLAIM entry list."""
    if isinstance(reply, dict):
        reply = list(reply.items())
    out: list[tuple[str, dict[str, str]]] = []
    for item in reply or []:
        if len(item) == 2 and isinstance(item[1], list) and (not item[1] or isinstance(item[1][0], (list, tuple))):
            out.extend(_entries(item[1]))  # [stream, [(id, fields), ...]]
            continue
        entry_id, fields = item
        if fields is None:  # deleted while pending
            continue
        out.append((_text(entry_id), {_text(k): _text(v) for k, v in dict(fields).items()}))
    return out


class RedisStreamJobQueue:
    kind = "redis"

    def __init__(
        self,
        url: str,
        stream: str = STREAM_KEY,
        group: str = GROUP,
        name: str | None = None,
        maxlen: int = 100_000,
        block_ms: int = 5_000,
        min_idle_ms: int = 60_000,
        reclaim_every_s: float = 30.0,
        client: aioredis.Redis | None = None,
    ) -> None:
        self.redis = client or aioredis.Redis.from_url(url)
        self._owns_client = client is None
        self.stream, self.group = stream, group
        self.name = name or f"{socket.gethostname()}-{os.getpid()}"
        self.maxlen, self.block_ms = maxlen, block_ms
        self.min_idle_ms, self.reclaim_every_s = min_idle_ms, reclaim_every_s
        self._group_ready = False

    async def ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def put(self, job: Job) -> None:
        try:
            await self.redis.xadd(self.stream, job.fields(), maxlen=self.maxlen, approximate=True)
        except (RedisError, OSError) as exc:
            log.warning("could not enqueue %s job (%s); the periodic sweep will catch up", job.kind, exc)

    async def read(self, count: int = 10, block_ms: int | None = None) -> list[tuple[str, Job]]:
        """New entries for this consumer (they stay pending until ``ack``)."""
        await self.ensure_group()
        block = self.block_ms if block_ms is None else block_ms
        reply = await self.redis.xreadgroup(self.group, self.name, {self.stream: ">"}, count=count, block=block)
        return [(i, Job.from_fields(f)) for i, f in _entries(reply)]

    async def reclaim(self, count: int = 50) -> list[tuple[str, Job]]:
        """Entries another consumer took and left unacknowledged for longer than ``min_idle_ms``."""
        await self.ensure_group()
        reply = await self.redis.xautoclaim(self.stream, self.group, self.name, self.min_idle_ms, "0-0", count=count)
        return [(i, Job.from_fields(f)) for i, f in _entries(reply[1])]

    async def ack(self, entry_id: str) -> None:
        await self.redis.xack(self.stream, self.group, entry_id)

    async def handle(self, entries: list[tuple[str, Job]], handler: Handler) -> int:
        for entry_id, job in entries:
            await _safely(handler, job)
            await self.ack(entry_id)
        return len(entries)

    async def run(self, handler: Handler) -> None:
        last_reclaim = 0.0
        while True:
            try:
                if time.monotonic() - last_reclaim >= self.reclaim_every_s:
                    last_reclaim = time.monotonic()
                    await self.handle(await self.reclaim(), handler)
                await self.handle(await self.read(), handler)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("job stream unavailable (%s); retrying in 5 s", exc)
                self._group_ready = False
                await asyncio.sleep(5.0)

    async def claim(self, name: str, ttl_s: float) -> bool:
        try:
            key = f"{self.stream}:claim:{name}"
            return bool(await self.redis.set(key, self.name, nx=True, px=max(1, int(ttl_s * 1000))))
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        if self._owns_client:
            await self.redis.aclose()
