"""Virtual keys: which tenant and upstream key a client key stands for, its limits and its token budget.

Keys live in PostgreSQL (``memci_proxy.store.sql.key_queries``; the ``virtual_keys`` setting seeds them at start-up)
and are read through a per-process cache, so a request costs no database query while its key is cached:

- with Redis, every change (create, revoke, rotate, limits) increments ``memci:keys:version``; each process
  polls it every ``VERSION_POLL_S`` and empties its cache when it moved, so a revocation reaches every replica
  within a second; cached entries are also re-read after ``TTL_WITH_REDIS_S``;
- without Redis (or while it fails) cached entries live ``TTL_WITHOUT_REDIS_S`` (0.8 s), which bounds
  the delay the same way for several server workers or replicas; the process that made a change empties its
  own cache at once;
- without a database, the keys of the settings are the only keys.

Keys are compared by their sha256 (``hmac.compare_digest`` on equal-length digests), never stored in clear,
never logged. Usage (the upstream's reported tokens) is added to the key behind the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import secrets
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.settings import SettingsError
from memci_proxy.turn.end_user import MAX_USER_ID_CHARS

log = logging.getLogger("memci.keys")

KEY_PREFIX = "sk-memci-"
VERSION_KEY = "memci:keys:version"
VERSION_POLL_S = 0.25
TTL_WITH_REDIS_S = 30.0
TTL_WITHOUT_REDIS_S = 0.8  # under a second, query time included
CACHE_ENTRIES = 10_000  # known and unknown keys (an unknown key is cached too: no query per bad request)


def new_secret() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(8)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_hint(key: str) -> str:
    """What listings show of a key: its first and last four characters (the prefix of generated keys kept)."""
    head = KEY_PREFIX + key[len(KEY_PREFIX):][:4] if key.startswith(KEY_PREFIX) else key[:4]
    if len(key) <= len(head) + 8:
        return key[:2] + "…"
    return f"{head}…{key[-4:]}"


def same_digest(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _cached_key_bytes(digest: str, cached: tuple[VirtualKey | None, float]) -> int:
    key = cached[0]
    texts = 0 if key is None else sum(len(t) for t in (key.id, key.tenant, key.tenant_name, key.upstream_key,
                                                        key.key_hash, key.end_user))
    return len(digest) + texts + 400


@dataclass(frozen=True)
class VirtualKey:
    """What a request authenticated by a virtual key carries (the limits and budget of its key)."""

    id: str
    tenant: str  # the tenant id (memci_proxy.api.auth.virtual_tenant of the name)
    tenant_name: str
    upstream_key: str
    key_hash: str
    rate_limit_rps: float | None = None
    rate_limit_burst: int | None = None
    budget_tokens: int | None = None
    used_tokens: int = 0
    revoked: bool = False
    end_user: str = ""  # the keyed hash of the one end user the key is bound to (memci_proxy.turn.end_user), or ""

    @property
    def over_budget(self) -> bool:
        return self.budget_tokens is not None and self.used_tokens >= self.budget_tokens


@dataclass(frozen=True)
class SettingsKey:
    """A key of the ``virtual_keys`` setting, without the key itself."""

    tenant_name: str
    upstream_key: str
    hint: str
    user: str = ""  # the end user the key is bound to, as configured ("" for none); stored only as its keyed hash


def parse_virtual_keys(text: str) -> dict[str, SettingsKey]:
    """sha256 of the client key -> SettingsKey, from JSON or TOML given inline or as a file path.

    Shape: ``{"<client key>": {"tenant": "<name>", "upstream_key": "<key>", "user": "<end user>"}}``, optionally
    under a ``keys`` table. ``upstream_key`` may be empty or missing: the upstream then gets ``upstream_api_key``
    (or no key). ``user`` (optional) binds the key to one end user.
    """
    raw = text.strip()
    if not raw:
        return {}
    if not raw.startswith(("{", "[")) and "=" not in raw:
        path = Path(os.path.expanduser(raw))
        try:
            raw = path.read_text()
        except OSError as exc:
            raise SettingsError(f"setting 'virtual_keys': cannot read {path}: {exc}") from None
    data: Any
    try:
        data = json.loads(raw)
    except ValueError:
        try:
            data = tomllib.loads(raw)
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"setting 'virtual_keys': neither JSON nor TOML: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("keys"), dict):
        data = data["keys"]
    if not isinstance(data, dict):
        raise SettingsError("setting 'virtual_keys': expected a table of client key -> {tenant, upstream_key}")
    out: dict[str, SettingsKey] = {}
    for client_key, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("tenant"), str) or not entry["tenant"].strip():
            raise SettingsError(f"setting 'virtual_keys': the entry of key {client_key[:4]}... needs a 'tenant' name")
        upstream_key = entry.get("upstream_key") or ""
        if not isinstance(upstream_key, str):
            raise SettingsError(f"setting 'virtual_keys': 'upstream_key' of key {client_key[:4]}... must be text")
        user = entry.get("user") or ""
        if not isinstance(user, str) or len(user.strip()) > MAX_USER_ID_CHARS:
            raise SettingsError(f"setting 'virtual_keys': 'user' of key {client_key[:4]}... must be text of at most "
                                f"{MAX_USER_ID_CHARS} characters")
        if not client_key.strip():
            raise SettingsError("setting 'virtual_keys': empty client key")
        key = client_key.strip()
        out[key_digest(key)] = SettingsKey(entry["tenant"].strip(), upstream_key, key_hint(key), user.strip())
    return out


class KeyStoreUnavailable(Exception):
    """The database could not be asked about a key that is not cached."""


class KeyRegistry:
    """``static``: digest -> VirtualKey of the settings' keys (the only keys without a database).
    ``tenant_of(name)``: the tenant id of a tenant name."""

    def __init__(self, static: dict[str, VirtualKey], tenant_of: Callable[[str], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.static = static
        self.tenant_of = tenant_of
        self.clock = clock
        self.repo: Any = None
        self._redis: Any = None
        self._redis_ok = False
        self._version: bytes | None = None
        self._cache: BoundedLru[str, tuple[VirtualKey | None, float]] = BoundedLru(
            "virtual_keys", CACHE_ENTRIES, CACHE_ENTRIES * 1024, size_of=_cached_key_bytes)
        self._poller: asyncio.Task[None] | None = None
        self._writes: set[asyncio.Task[None]] = set()

    @property
    def persistent(self) -> bool:
        return self.repo is not None

    # --- wiring ------------------------------------------------------------------------------------------------
    async def attach(self, repo: Any, redis_url: str = "",
                     seeds: dict[str, tuple[str, str, str, str]] | None = None) -> None:
        """Use the database (and Redis for change notices) from now on. ``seeds``: digest -> (hint, tenant name,
        upstream key, end user's key or "") of the settings' keys, written into the database."""
        self.repo = repo
        for digest, (hint, tenant_name, upstream_key, end_user) in (seeds or {}).items():
            await repo.seed("key_s" + digest[:15], digest, hint, tenant_name, upstream_key, end_user or None)
        if redis_url:
            import redis.asyncio as aioredis

            self._redis = aioredis.from_url(redis_url, socket_timeout=0.5, socket_connect_timeout=0.5)
            await self._poll_version()
            self._poller = asyncio.create_task(self._poll_forever(), name="memci-key-version")
        self._cache.clear()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        if self._redis is not None:
            await self._redis.aclose()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(VERSION_POLL_S)
            await self._poll_version()

    async def _poll_version(self) -> None:
        try:
            version = await self._redis.get(VERSION_KEY)
        except Exception:
            if self._redis_ok:
                log.warning("Redis unreachable: virtual keys are re-read every %.1f s", TTL_WITHOUT_REDIS_S)
            self._redis_ok = False
            return
        self._redis_ok = True
        if version != self._version:
            self._version = version
            self._cache.clear()

    # --- lookups -----------------------------------------------------------------------------------------------
    def _ttl(self) -> float:
        return TTL_WITH_REDIS_S if self._redis_ok else TTL_WITHOUT_REDIS_S

    async def lookup(self, key: str) -> VirtualKey | None:
        """The live key (None: unknown or revoked). Raises KeyStoreUnavailable when the database cannot answer
        for a key this process knows nothing about."""
        digest = key_digest(key)
        if self.repo is None:
            found = self.static.get(digest)
            return found if found is not None and same_digest(found.key_hash, digest) else None
        cached = self._cache.get(digest)
        now = self.clock()
        if cached is None or now - cached[1] > self._ttl():
            try:
                record = await self.repo.find(digest)
            except Exception as exc:
                log.warning("virtual key lookup failed (%s)", type(exc).__name__)
                if cached is not None:
                    return cached[0]  # the database is down: nothing can be revoked meanwhile either
                found = self.static.get(digest)
                if found is not None:
                    return found
                raise KeyStoreUnavailable() from None
            found = None if record is None else self._from_record(record, digest)
            cached = (found, now)
            self._cache.put(digest, cached)
        found = cached[0]
        if found is None or found.revoked:
            return None
        return found if same_digest(found.key_hash, digest) else None

    def _from_record(self, record: Any, digest: str) -> VirtualKey:
        return VirtualKey(
            id=record.id, tenant=self.tenant_of(record.tenant), tenant_name=record.tenant,
            upstream_key=record.upstream_key, key_hash=digest, rate_limit_rps=record.rate_limit_rps,
            rate_limit_burst=record.rate_limit_burst, budget_tokens=record.budget_tokens,
            used_tokens=record.used_tokens, revoked=record.revoked, end_user=record.end_user or "",
        )

    # --- changes -----------------------------------------------------------------------------------------------
    async def changed(self) -> None:
        """A key was created, revoked, rotated or changed: every process forgets its cached keys."""
        self._cache.clear()
        if self._redis is not None:
            try:
                self._version = str(await self._redis.incr(VERSION_KEY)).encode()  # what GET will return
            except Exception as exc:
                log.warning("could not announce a key change through Redis (%s): other replicas see it within "
                            "%.1f s", type(exc).__name__, TTL_WITHOUT_REDIS_S)
                self._redis_ok = False

    def charge(self, vk: VirtualKey, tokens: int) -> None:
        """Add the upstream's reported tokens to the key: at once in this process's cache, behind the answer in
        the database."""
        if tokens <= 0 or self.repo is None:
            return
        cached = self._cache.peek(vk.key_hash)
        if cached is not None and cached[0] is not None:
            self._cache.put(vk.key_hash, (replace(cached[0], used_tokens=cached[0].used_tokens + tokens), cached[1]))
        task = asyncio.get_running_loop().create_task(self._add_usage(vk.id, tokens))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _add_usage(self, key_id: str, tokens: int) -> None:
        try:
            await self.repo.add_usage(key_id, tokens)
        except Exception as exc:
            log.warning("could not add %d tokens to the usage of key %s (%s)", tokens, key_id, type(exc).__name__)
