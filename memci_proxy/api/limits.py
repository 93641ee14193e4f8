"""Limits and back-pressure: message count, per-tenant rate and open streams, upstream concurrency.

- Message count: a chat request with more than ``max_messages`` messages is a 400 (param ``messages``).
- Per-tenant rate: a token bucket (``rate_limit_rps`` refill, ``rate_limit_burst`` size); per-tenant open streams
  (``max_concurrent_streams_per_tenant``). Both live in Redis when ``redis_url`` is set (atomic Lua scripts, so
  every replica shares them), in-process otherwise or while Redis fails (counted in a metric).
- Upstream concurrency: at most ``upstream_max_inflight`` requests of this process are in flight to the upstream;
  others wait in a FIFO queue bounded in length (``upstream_max_queue``) and time
  (``upstream_queue_timeout_ms``). Past either the client gets 429 with ``Retry-After``, never an unbounded wait.

Rejections are OpenAI-style ``rate_limit_exceeded`` errors, counted by reason.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from memci_proxy.api.auth import KEY_SCOPE, send_error
from memci_proxy.caches import BoundedLru
from memci_proxy.turn.identity import AUTH_TENANT_HEADER, ANONYMOUS
from memci_proxy.settings import Settings
from memci_proxy.wire.errors import ProxyError, bad_request

log = logging.getLogger("memci.limits")
_TENANT = AUTH_TENANT_HEADER.encode()
RELEASES_KEY = "memci.releases"  # scope key: callbacks the middleware runs when the response is done
STREAM_LEASE_SECONDS = 900.0  # a crashed replica's stream slots in Redis free themselves after this
_MAX_LOCAL_TENANTS = 100_000


def rate_limited(message: str, retry_after: float, code: str = "rate_limit_exceeded") -> ProxyError:
    seconds = max(1, math.ceil(retry_after))
    return ProxyError(429, message, "rate_limit_error", code, headers={"Retry-After": str(seconds)})


# --- token bucket arithmetic (the Lua script below mirrors it) -----------------------------------------------
def take_token(tokens: float, last: float, now: float, rate: float, burst: float,
               cost: float = 1.0) -> tuple[bool, float, float]:
    """(allowed, tokens left, seconds until ``cost`` tokens are there) for a bucket last seen at ``last``."""
    tokens = min(burst, tokens + max(0.0, now - last) * rate)
    if tokens >= cost:
        return True, tokens - cost, 0.0
    return False, tokens, (cost - tokens) / rate


def bucket_size(rate: float, burst: int) -> float:
    return float(burst) if burst > 0 else float(max(1, math.ceil(rate)))


class LocalBuckets:
    """Token buckets in this process (an LRU bounded in entries: a bucket dropped starts full again), on an
    injectable clock. ``take`` may name its own rate and size (per-key limits)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: BoundedLru[str, tuple[float, float]] = BoundedLru(
            "limit_buckets", _MAX_LOCAL_TENANTS, _MAX_LOCAL_TENANTS * 256, size_of=lambda tenant, _v: len(tenant) + 160)

    def take(self, tenant: str, rate: float | None = None, burst: float | None = None) -> tuple[bool, float]:
        rate = self.rate if rate is None else rate
        burst = self.burst if burst is None else burst
        now = self.clock()
        tokens, last = self._buckets.get(tenant) or (burst, now)
        allowed, tokens, wait = take_token(tokens, last, now, rate, burst)
        self._buckets.put(tenant, (tokens, now))
        return allowed, wait


class LocalStreams:
    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def acquire(self, tenant: str, limit: int) -> bool:
        if self.open.get(tenant, 0) >= limit:
            return False
        self.open[tenant] = self.open.get(tenant, 0) + 1
        return True

    def release(self, tenant: str) -> None:
        left = self.open.get(tenant, 0) - 1
        if left > 0:
            self.open[tenant] = left
        else:
            self.open.pop(tenant, None)


# KEYS[1] bucket hash; ARGV: rate, burst, cost, ttl ms. Redis' own clock, so replicas agree. -> {allowed, wait}
_TAKE_TOKEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(v[1]), tonumber(v[2])
if tokens == nil or ts == nil then tokens = burst; ts = now end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local allowed, wait = 0, 0
if tokens >= cost then tokens = tokens - cost; allowed = 1 else wait = (cost - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {allowed, tostring(wait)}
"""

# KEYS[1] sorted set member -> lease end; ARGV: limit, member, lease seconds. -> 1 taken, 0 full
_ACQUIRE_STREAM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.floor(tonumber(ARGV[3]) * 1000))
return 1
"""


def rate_key(tenant: str) -> str:
    return f"memci:limit:{{{tenant}}}:rate"


def streams_key(tenant: str) -> str:
    return f"memci:limit:{{{tenant}}}:streams"


class UpstreamGate:
    """At most ``limit`` holders; a FIFO of at most ``max_queue`` waiters, each waiting at most ``timeout``."""

    def __init__(self, limit: int, max_queue: int, timeout: float) -> None:
        self.limit, self.max_queue, self.timeout = limit, max_queue, timeout
        self.inflight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self) -> str | None:
        """None when a slot is held (call ``release``), else why not: ``upstream_queue_full``/``_timeout``."""
        if self.inflight < self.limit and not self.waiting:
            self.inflight += 1
            return None
        if self.waiting >= self.max_queue or self.timeout <= 0:
            return "upstream_queue_full"
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait({waiter}, timeout=self.timeout)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot while being cancelled: pass it on
            else:
                self._forget(waiter)
            raise
        if waiter.done() and not waiter.cancelled():
            return None  # release() handed its slot over
        self._forget(waiter)
        return "upstream_queue_timeout"

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        waiter.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the oldest waiter: inflight unchanged
                return
        self.inflight = max(0, self.inflight - 1)


class Limits:
    """Every limit of one process, with its metrics; Redis-backed when ``redis_url`` is set."""

    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.rate = settings.rate_limit_rps
        self.burst = bucket_size(self.rate, settings.rate_limit_burst)
        self.max_streams = settings.max_concurrent_streams_per_tenant
        self.buckets = LocalBuckets(self.rate, self.burst, clock)
        self.streams = LocalStreams()
        self.gate = UpstreamGate(settings.upstream_max_inflight, settings.upstream_max_queue,
                                 settings.upstream_queue_timeout_ms / 1000.0)
        self._redis: Any = None
        self._scripts: dict[str, Any] = {}
        r = registry or CollectorRegistry()
        self.rejections = Counter("memci_limit_rejections", "Requests refused by a limit, by reason.", ["reason"],
                                  registry=r)
        self.backend_errors = Counter(
            "memci_limit_backend_errors", "Limit checks that fell back to in-process because Redis failed.",
            registry=r,
        )
        Gauge("memci_upstream_inflight", "Requests of this process in flight to the upstream.",
              registry=r).set_function(lambda: self.gate.inflight)
        Gauge("memci_upstream_queued", "Requests waiting for an upstream slot.",
              registry=r).set_function(lambda: self.gate.waiting)

    # --- Redis ------------------------------------------------------------------------------------------------
    def _client(self) -> Any:
        if not self.settings.redis_url:
            return None
        if self._redis is None:
            import redis.asyncio as aioredis

            self._redis = aioredis.from_url(self.settings.redis_url, socket_timeout=0.5,
                                            socket_connect_timeout=0.5)
            self._scripts = {"take": self._redis.register_script(_TAKE_TOKEN),
                             "stream": self._redis.register_script(_ACQUIRE_STREAM)}
        return self._redis

    def _fell_back(self, what: str) -> None:
        self.backend_errors.inc()
        log.warning("Redis failed during the %s limit check; using the in-process limit", what)

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    # --- checks -----------------------------------------------------------------------------------------------
    def reject(self, reason: str, error: ProxyError) -> ProxyError:
        self.rejections.labels(reason).inc()
        return error

    def check_messages(self, data: dict[str, Any], param: str = "messages") -> None:
        """400 for a chat body of more than ``max_messages`` messages; ``param``: the field of the client's API the
        messages came from (Responses: ``input``, with the conversation before it)."""
        limit = self.settings.max_messages
        messages = data.get("messages")
        if limit and isinstance(messages, list) and len(messages) > limit:
            what = f"'{param}' has {len(messages)} items" if param == "messages" else (
                f"the conversation ('{param}' and what came before it) has {len(messages)} messages")
            raise self.reject("messages", bad_request(f"{what}; at most {limit} are accepted", param=param,
                                                      code="too_many_messages"))

    async def check_rate(self, tenant: str, key: Any = None) -> None:
        """The tenant's bucket; a virtual key with a rate of its own (``rate_limit_rps``, 0: none) has its own
        bucket instead."""
        rate, burst, bucket = self.rate, self.burst, tenant
        if key is not None and key.rate_limit_rps is not None:
            rate, bucket = key.rate_limit_rps, f"key:{key.id}"
            burst = bucket_size(rate, key.rate_limit_burst or 0) if rate > 0 else 0.0
        if rate <= 0:
            return
        allowed, wait = None, 0.0
        client = self._client()
        if client is not None:
            try:
                ttl_ms = int(1000 * max(60.0, 2 * burst / rate))
                got, wait_text = await self._scripts["take"](keys=[rate_key(bucket)], args=[rate, burst, 1, ttl_ms])
                allowed, wait = bool(int(got)), float(wait_text)
            except Exception:
                self._fell_back("rate")
        if allowed is None:
            allowed, wait = self.buckets.take(bucket, rate, burst)
        if not allowed:
            raise self.reject("rate", rate_limited(
                f"Rate limit reached: {rate:g} requests per second for this key. Retry after the "
                "Retry-After header's seconds.", wait))

    async def acquire_stream(self, tenant: str) -> Callable[[], Any] | None:
        """Take one of the tenant's stream slots (ProxyError 429 when none is free); returns its release."""
        if self.max_streams <= 0:
            return None
        client = self._client()
        if client is not None:
            member = uuid.uuid4().hex
            try:
                taken = int(await self._scripts["stream"](keys=[streams_key(tenant)],
                                                         args=[self.max_streams, member, STREAM_LEASE_SECONDS]))
            except Exception:
                self._fell_back("streams")
            else:
                if not taken:
                    raise self._too_many_streams()

                async def release_remote() -> None:
                    try:
                        await client.zrem(streams_key(tenant), member)
                    except Exception:
                        self._fell_back("streams release")  # the lease frees the slot later

                return release_remote
        if not self.streams.acquire(tenant, self.max_streams):
            raise self._too_many_streams()
        return lambda: self.streams.release(tenant)

    def _too_many_streams(self) -> ProxyError:
        return self.reject("streams", rate_limited(
            f"Too many concurrent streams for this key (at most {self.max_streams}).", 1.0,
            "too_many_concurrent_streams"))

    async def acquire_upstream(self) -> bool:
        """True when a slot is held (release with ``self.gate.release()``); False when there is no limit."""
        if self.gate.limit <= 0:
            return False
        why = await self.gate.acquire()
        if why is not None:
            raise self.reject(why, rate_limited(
                "The upstream is at capacity; retry after the Retry-After header's seconds.",
                max(1.0, self.gate.timeout), "rate_limit_exceeded"))
        return True


async def admit_stream(scope: dict, limits: Limits, tenant: str) -> None:
    """Route-level: hold one of the tenant's stream slots until the response is done (429 when none is free)."""
    release = await limits.acquire_stream(tenant)
    if release is not None:
        scope.setdefault(RELEASES_KEY, []).append(release)


class LimitsMiddleware:
    """ASGI middleware on /v1: per-tenant rate, then an upstream slot held until the response is done."""

    def __init__(self, app: Any, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or not scope.get("path", "").startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        tenant = next((v.decode() for k, v in scope.get("headers", []) if k == _TENANT), ANONYMOUS)
        key = scope.get(KEY_SCOPE)  # the virtual key (memci_proxy.api.auth), when the request came with one
        holding = False
        releases: list[Callable[[], Any]] = scope.setdefault(RELEASES_KEY, [])
        try:
            try:
                await self.limits.check_rate(tenant, key)
                holding = await self.limits.acquire_upstream()
            except ProxyError as exc:
                await send_error(send, exc, scope.get("path", ""))
                return
            await self.app(scope, receive, send)
        finally:
            if holding:
                self.limits.gate.release()
            for release in releases:
                try:
                    result = release()
                    if asyncio.iscoroutine(result):
                        await asyncio.shield(result)
                except Exception:
                    log.exception("releasing a limit slot failed")
