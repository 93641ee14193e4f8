"""HotState on Redis (redis-py asyncio), shared by every replica.

Keys (hash tags keep a conversation's keys on one Redis Cluster slot):
- ``memci:{<conversation>}:state``   hash {v: version, s: snapshot bytes}, with a TTL
- ``memci:{<conversation>}:lock``    owner token, PX lease
- ``memci:{<conversation>}:fps``     set of the fingerprint keys pointing at the conversation
- ``memci:fp:{<tenant>:<chain hash>}`` "<length>:<conversation id>", with a TTL
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError

from memci_proxy.store.hot.locking import hold_lease

PREFIX = "memci"

# KEYS[1] state key; ARGV: version, snapshot, ttl ms. Keeps a newer stored version.
_PUT_SNAPSHOT = """
local current = redis.call('HGET', KEYS[1], 'v')
if current and tonumber(current) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[1], 's', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS[1] state key; ARGV[1] version. {version, snapshot} when the stored version is above it, else nothing.
_GET_NEWER_SNAPSHOT = """
local found = redis.call('HMGET', KEYS[1], 'v', 's')
if found[1] and found[2] and tonumber(found[1]) > tonumber(ARGV[1]) then return found end
return false
"""

# KEYS[1] lock key; ARGV[1] token.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS[1] lock key; ARGV: token, lease ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


def state_key(conversation_id: str) -> str:
    return f"{PREFIX}:{{{conversation_id}}}:state"


def lock_key(conversation_id: str) -> str:
    return f"{PREFIX}:{{{conversation_id}}}:lock"


def fingerprint_index_key(conversation_id: str) -> str:
    return f"{PREFIX}:{{{conversation_id}}}:fps"


def fingerprint_key(tenant: str, chain_hash: str) -> str:
    return f"{PREFIX}:fp:{{{tenant}:{chain_hash}}}"


def _ms(seconds: float) -> int:
    return max(int(seconds * 1000), 1)


class RedisHotState:
    """Implements memci_proxy.store.ports.HotState over Redis."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        client: aioredis.Redis | None = None,
        connect_timeout_s: float = 1.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.url = url
        # Short timeouts and one quick retry: the hot path must not hang on a sick Redis
        # (ResilientHotState then falls back to in-process state).
        self.client: aioredis.Redis = client or aioredis.Redis.from_url(
            url,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=timeout_s,
            retry=Retry(ExponentialBackoff(cap=0.05, base=0.005), 1),
        )
        self._put_snapshot = self.client.register_script(_PUT_SNAPSHOT)
        self._get_newer_snapshot = self.client.register_script(_GET_NEWER_SNAPSHOT)
        self._release = self.client.register_script(_RELEASE)
        self._renew = self.client.register_script(_RENEW)

    # --- snapshots ---------------------------------------------------------------------------
    async def get_snapshot(self, conversation_id: str, newer_than: int = -1) -> tuple[bytes, int] | None:
        if newer_than < 0:
            version, snapshot = await self.client.hmget(state_key(conversation_id), ["v", "s"])
        else:  # the snapshot's bytes cross the network only when they are newer than the caller's copy
            found = await self._get_newer_snapshot(keys=[state_key(conversation_id)], args=[newer_than])
            version, snapshot = found if found else (None, None)
        if version is None or snapshot is None:
            return None
        return bytes(snapshot), int(version)

    async def put_snapshot(self, conversation_id: str, snapshot: bytes, version: int, ttl_s: float) -> None:
        await self._put_snapshot(keys=[state_key(conversation_id)], args=[version, snapshot, _ms(ttl_s)])

    # --- fingerprints ------------------------------------------------------------------------
    async def get_fingerprint(self, tenant: str, chain_hash: str) -> tuple[str, int] | None:
        value = await self.client.get(fingerprint_key(tenant, chain_hash))
        if value is None:
            return None
        length, _, conversation_id = value.decode().partition(":")
        return conversation_id, int(length)

    async def put_fingerprints(self, tenant: str, items: list[tuple[str, str, int]], ttl_s: float) -> None:
        if not items:
            return
        ttl_ms = _ms(ttl_s)
        by_conversation: dict[str, list[str]] = {}
        async with self.client.pipeline(transaction=False) as pipe:
            for chain_hash, conversation_id, length in items:
                key = fingerprint_key(tenant, chain_hash)
                pipe.set(key, f"{length}:{conversation_id}", px=ttl_ms)
                by_conversation.setdefault(conversation_id, []).append(key)
            for conversation_id, keys in by_conversation.items():
                pipe.sadd(fingerprint_index_key(conversation_id), *keys)
                pipe.pexpire(fingerprint_index_key(conversation_id), ttl_ms)
            await pipe.execute()

    async def delete_conversation(self, conversation_id: str) -> None:
        index_key = fingerprint_index_key(conversation_id)
        keys = [k.decode() for k in await self.client.smembers(index_key)]
        async with self.client.pipeline(transaction=False) as pipe:
            for key in keys:  # one by one: the keys live on other cluster slots
                pipe.delete(key)
            pipe.delete(index_key, state_key(conversation_id))
            await pipe.execute()

    # --- session lock ------------------------------------------------------------------------
    def lock(
        self, conversation_id: str, timeout_s: float = 30.0, lease_s: float = 60.0
    ) -> AbstractAsyncContextManager[None]:
        return hold_lease(self, conversation_id, timeout_s, lease_s)

    async def try_acquire(self, conversation_id: str, token: str, lease_s: float) -> bool:
        return bool(await self.client.set(lock_key(conversation_id), token, nx=True, px=_ms(lease_s)))

    async def renew(self, conversation_id: str, token: str, lease_s: float) -> bool:
        return bool(await self._renew(keys=[lock_key(conversation_id)], args=[token, _ms(lease_s)]))

    async def release(self, conversation_id: str, token: str) -> bool:
        return bool(await self._release(keys=[lock_key(conversation_id)], args=[token]))

    async def wait_for_release(self, conversation_id: str, backoff_s: float, remaining_s: float) -> None:
        await asyncio.sleep(min(backoff_s, remaining_s))

    # --- lifecycle ---------------------------------------------------------------------------
    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        await self.client.aclose()
