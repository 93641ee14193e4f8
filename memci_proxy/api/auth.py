"""Who is asking: the one place a request's tenant is decided, and what key goes upstream for it.

Modes (setting ``auth_mode``):
- ``passthrough``: the tenant is a hash of the client's bearer key (``tenant_of``); the key goes upstream.
- ``virtual_keys``: only known virtual keys are accepted (401 otherwise), each mapped to a tenant and an upstream
  key (memci_proxy.keys: PostgreSQL, seeded from the ``virtual_keys`` setting, managed through /memci/keys); the
  client's key is replaced before any handler sees the request, so it never goes upstream. A key over its
  token budget gets 429 ``insufficient_quota``.

The ASGI middleware ``AuthMiddleware`` resolves every /v1 and /memci request once and writes the tenant into the
proxy-owned request header ``X-Memci-Auth-Tenant``, and for a key bound to one end user that user's keyed hash into
``X-Memci-Auth-User`` (a client's own copies are always dropped);
``memci_proxy.turn.identity.tenant_of(headers)`` reads it from there, so every tenant-scoped lookup takes its tenant
from this module.

The admin key is not a chat credential and never leaves the proxy: on /v1/* it is refused like an unknown key
(401, every auth mode); on /memci/* the request is marked as the admin's (scope entry ``memci.admin``, which the
admin endpoints check) and its Authorization header is dropped before any handler sees it. No upstream key may
equal it (checked at start and when a key is created or changed). Keys are compared as sha256 digests with
``hmac.compare_digest``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import xxhash

from memci_proxy import usage_meter
from memci_proxy.api.error_shapes import error_body_for
from memci_proxy.turn.end_user import AUTH_USER_HEADER, user_key
from memci_proxy.turn.identity import AUTH_TENANT_HEADER, key_tenant
from memci_proxy.keys import (  # noqa: F401 - parse_virtual_keys and SettingsKey are re-exported
    KeyRegistry,
    KeyStoreUnavailable,
    SettingsKey,
    VirtualKey,
    key_digest,
    parse_virtual_keys,
    same_digest,
)
from memci_proxy.settings import Settings, SettingsError
from memci_proxy.wire import logtext
from memci_proxy.wire.errors import ProxyError

log = logging.getLogger("memci.auth")
_AUTH_TENANT = AUTH_TENANT_HEADER.encode()
_AUTH_USER = AUTH_USER_HEADER.encode()
_AUTH_OWNED = (_AUTH_TENANT, _AUTH_USER)
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_encode = msgspec.json.Encoder().encode
KEY_SCOPE = "memci.key"  # ASGI scope entry: the VirtualKey of the request (limits read its rate)
ADMIN_SCOPE = "memci.admin"  # ASGI scope entry: True when the request bore the admin key (/memci/* only)
CREDENTIAL_SCOPE = "memci.credential"  # ASGI scope entry: True when the request bore a key at all
PROMPT_LOG_LIMIT = 64 * 1024  # bytes of a request body the prompt log shows at most


@dataclass(frozen=True)
class Identity:
    tenant: str
    upstream_key: str | None  # None: the request's own Authorization goes upstream unchanged
    key: VirtualKey | None = None


def virtual_tenant(name: str) -> str:
    """The tenant id of a configured tenant name (same shape as a key's tenant, distinct prefix)."""
    return "v" + xxhash.xxh3_128_hexdigest(name.encode())[:24]


def bearer_of(headers: Mapping[str, str]) -> str:
    """The client's key: the Authorization bearer token, else Anthropic's ``x-api-key``."""
    auth = headers.get("authorization") or headers.get("Authorization") or ""
    if not auth:
        return (headers.get("x-api-key") or headers.get("X-Api-Key") or "").strip()
    return auth[7:].strip() if auth[:7].lower() == "bearer " else auth.strip()


def invalid_key() -> ProxyError:
    return ProxyError(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")


def over_budget(vk: VirtualKey) -> ProxyError:
    """OpenAI's answer to an exhausted quota: 429 ``insufficient_quota`` (no Retry-After: waiting will not help)."""
    return ProxyError(
        429, f"This key has used its budget of {vk.budget_tokens} tokens ({vk.used_tokens} used). Ask the operator "
        "to raise the budget or issue another key.", "insufficient_quota", "insufficient_quota")


def is_admin_key(given: str, admin_key: str) -> bool:
    """Constant-time comparison of a bearer key with the admin key (as sha256 digests of equal length)."""
    if not admin_key or not given:
        return False
    return same_digest(key_digest(given), key_digest(admin_key))


class Authenticator:
    """Resolves a request's identity from its Authorization header."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.mode = settings.auth_mode
        self.admin_key = settings.admin_key
        self.seeds = parse_virtual_keys(settings.virtual_keys) if self.mode == "virtual_keys" else {}
        if self.mode == "virtual_keys" and not self.seeds and not self.admin_key:
            raise SettingsError("setting 'virtual_keys': auth_mode virtual_keys needs at least one key (or an "
                                "admin_key to create keys with through /memci/keys)")
        static = {
            digest: VirtualKey("key_s" + digest[:15], virtual_tenant(k.tenant_name), k.tenant_name, k.upstream_key,
                               digest, end_user=self.bound_user(k.tenant_name, k.user))
            for digest, k in self.seeds.items()
        }
        self.keys = KeyRegistry(static, virtual_tenant)
        if self.admin_key:
            _check_admin_key_distinct(settings, self.seeds)

    def bound_user(self, tenant_name: str, user: str) -> str:
        """What a key bound to ``user`` stores and carries: the user's keyed hash under the key's tenant ("")."""
        return user_key(virtual_tenant(tenant_name), user, self.settings.user_hash_key)

    async def attach(self, repo: Any, redis_url: str = "") -> None:
        """Keys from PostgreSQL from now on (the settings' keys written there first)."""
        seeds = {d: (k.hint, k.tenant_name, k.upstream_key, self.bound_user(k.tenant_name, k.user))
                 for d, k in self.seeds.items()}
        await self.keys.attach(repo, redis_url, seeds)

    def is_admin(self, headers: Mapping[str, str]) -> bool:
        return is_admin_key(bearer_of(headers), self.admin_key)

    async def resolve(self, headers: Mapping[str, str]) -> Identity:
        """The caller's identity; ProxyError 401 for a key virtual_keys mode does not know, 429 for a key over its
        budget, 503 when the key store cannot be asked."""
        key = bearer_of(headers)
        if self.mode != "virtual_keys":
            return Identity(key_tenant(key), None)
        if not key:
            raise invalid_key()
        try:
            found = await self.keys.lookup(key)
        except KeyStoreUnavailable:
            raise ProxyError(503, "The key store is unavailable; retry shortly.", "server_error",
                             "key_store_unavailable", headers={"Retry-After": "1"}) from None
        if found is None:
            raise invalid_key()
        if found.over_budget:
            raise over_budget(found)
        return Identity(found.tenant, found.upstream_key, found)


def is_admin_request(scope: Mapping[str, Any]) -> bool:
    """Whether the middleware found the admin key on this request (its Authorization header is gone by then)."""
    return scope.get(ADMIN_SCOPE) is True


def bore_a_key(scope: Mapping[str, Any]) -> bool:
    """Whether the request came with a key of any kind (a wrong admin key is told apart from a missing one)."""
    return scope.get(CREDENTIAL_SCOPE) is True


def _check_admin_key_distinct(settings: Settings, seeds: Mapping[str, SettingsKey]) -> None:
    """The admin key must not be a key the proxy sends anywhere, nor a client key: refuse such settings at start."""
    admin = settings.admin_key
    for name in ("upstream_api_key", "summary_model_api_key", "vision_api_key", "rewrite_model_api_key",
                 "embeddings_api_key"):
        if same_key(getattr(settings, name, ""), admin):
            raise SettingsError(f"setting '{name}': must differ from admin_key (the admin key never leaves the proxy)")
    for digest, seed in seeds.items():
        if same_digest(digest, key_digest(admin)) or same_key(seed.upstream_key, admin):
            raise SettingsError("setting 'virtual_keys': a client key or upstream key equals admin_key (the admin "
                                "key is not a chat credential and never leaves the proxy)")


def same_key(value: str, admin_key: str) -> bool:
    return bool(value) and is_admin_key(value, admin_key)


def _guarded(path: str) -> bool:
    return path.startswith("/v1/") or path.startswith("/memci/")


class AuthMiddleware:
    """ASGI middleware: resolve the tenant once, rewrite the headers the handlers and the upstream will see, and
    count the upstream's reported tokens against the request's virtual key."""

    def __init__(self, app: Any, authenticator: Authenticator) -> None:
        self.app = app
        self.auth = authenticator
        self.log_prompts = authenticator.settings.log_prompts
        key = authenticator.admin_key
        self._admin_bytes = key.encode("utf-8") if len(key) >= 8 else b""  # shorter: too likely to occur by chance

    def _carries_admin_key(self, scope: dict, raw: list[tuple[bytes, bytes]]) -> bool:
        """The admin key anywhere else a request could carry it upstream: another header (``api-key``,
        ``x-api-key``...) or the query string (``?api_key=``). Byte searches: no cost worth counting."""
        admin = self._admin_bytes
        if not admin:
            return False
        return admin in scope.get("query_string", b"") or any(admin in v for _, v in raw)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        raw = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _AUTH_OWNED]
        scope["headers"] = raw
        if not _guarded(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        if _CONTROL.search(scope.get("path", "")):  # no route has one; ids with NUL would reach PostgreSQL
            await send_error(send, ProxyError(404, "no route for a path with control characters",
                                              "invalid_request_error", "not_found"), scope.get("path", ""))
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        path = scope.get("path", "")
        scope[CREDENTIAL_SCOPE] = bool(bearer_of(headers))
        if self.auth.is_admin(headers) or (path.startswith("/v1/") and self._carries_admin_key(scope, raw)):
            if not scope.get("path", "").startswith("/memci/"):
                await send_error(send, invalid_key(), path)  # not a chat credential: refused like an unknown key
                return
            scope[ADMIN_SCOPE] = True
            scope["headers"] = [(k, v) for k, v in raw if k.lower() != b"authorization"]
            await self.app(scope, receive, send)
            return
        try:
            identity = await self.auth.resolve(headers)
        except ProxyError as exc:
            await send_error(send, exc, scope.get("path", ""))
            return
        if identity.upstream_key is not None:
            raw = [(k, v) for k, v in raw if k.lower() not in (b"authorization", b"x-api-key")]
            if identity.upstream_key:
                raw.append((b"authorization", f"Bearer {identity.upstream_key}".encode("latin-1")))
        raw.append((_AUTH_TENANT, identity.tenant.encode()))
        if identity.key is not None and identity.key.end_user:
            raw.append((_AUTH_USER, identity.key.end_user.encode()))
        scope["headers"] = raw
        if self.log_prompts and log.isEnabledFor(logging.DEBUG) and scope.get("path") == "/v1/chat/completions":
            receive = _logged_body(receive, identity.tenant)
        if identity.key is None:
            await self.app(scope, receive, send)
            return
        scope[KEY_SCOPE] = identity.key
        meter = usage_meter.UsageMeter()
        token = usage_meter.CURRENT.set(meter)
        try:
            await self.app(scope, receive, send)
        finally:
            usage_meter.CURRENT.reset(token)
            self.auth.keys.charge(identity.key, meter.tokens)


def _logged_body(receive: Any, tenant: str) -> Any:
    """``receive`` that writes the request body to the debug log once it is complete (setting log_prompts)."""
    chunks: list[bytes] = []
    size = 0

    async def logged() -> dict:
        nonlocal size
        message = await receive()
        if message.get("type") == "http.request":
            body = message.get("body", b"")
            if size < PROMPT_LOG_LIMIT:
                chunks.append(body[: PROMPT_LOG_LIMIT - size])
            size += len(body)
            if not message.get("more_body"):
                text = b"".join(chunks).decode("utf-8", "replace")
                log.debug("chat request of tenant %s (%d bytes): %s", tenant, size, logtext.field(text, PROMPT_LOG_LIMIT))
        return message

    return logged


async def send_error(send: Any, exc: ProxyError, path: str = "") -> None:
    """The error answered before a route runs, in the shape of the path's API (Anthropic's for /v1/messages)."""
    body = error_body_for(path, exc)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# --- SGLang cache_salt -------------------------------------------------------------------------------------
# SGLang takes an optional per-request ``cache_salt`` in the body of /v1/chat/completions and /v1/completions:
# requests share radix (prefix) cache entries only when both the prompt prefix and the salt match
# (sgl-project/sglang issue #9163 "Support Cache Salting for secure prefix caching", made effective for the
# OpenAI endpoints by PR #23300 "Fix cache salt and extra keys for prefix cache isolation"; vLLM has the same
# field). External/L3 KV storage (e.g. LMCache) may still key on tokens only (sglang issue #37160).

def cache_salt_of(tenant: str, client_salt: object = None) -> str:
    """The tenant's salt; a client's own salt is kept inside it, so it can never reach another tenant's."""
    if isinstance(client_salt, str) and client_salt:
        return f"{tenant}:{xxhash.xxh3_64_hexdigest(client_salt.encode())}"
    return tenant


def with_cache_salt(body: bytes, data: dict[str, Any], tenant: str) -> tuple[bytes, dict[str, Any]]:
    """The body and parsed data with the tenant's cache_salt; the messages' bytes are left as sent."""
    salt = cache_salt_of(tenant, data.get("cache_salt"))
    stripped = body.lstrip()
    if "cache_salt" in data or not stripped.startswith(b"{"):
        data = {**data, "cache_salt": salt}
        return _encode(data), data
    rest = stripped[1:]
    joiner = b"" if rest.lstrip().startswith(b"}") else b","
    return b'{"cache_salt":' + _encode(salt) + joiner + rest, {"cache_salt": salt, **data}
