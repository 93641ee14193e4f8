"""Who is asking: the one place a request's tenant is decided, and what key goes upstream for it.

Modes (setting ``auth_mode``):
- ``passthrough``: the tenant is a hash of the client's bearer key (``tenant_of``); the key goes upstream.
- ``virtual_keys``: only configured client keys are accepted (401 otherwise), each mapped to a tenant and an
  upstream key; the client's key is replaced before any handler sees the request, so it never goes upstream.

The ASGI middleware ``AuthMiddleware`` resolves every /v1 and /memci request once and writes the tenant into the
proxy-owned request header ``X-Memci-Auth-Tenant`` (a client's own copy is always dropped);
``proxy.turn.identity.tenant_of(headers)`` reads it from there, so every tenant-scoped lookup takes its tenant
from this module. Requests bearing the admin key pass untouched (admin endpoints check that key themselves).
"""

from __future__ import annotations

import hmac
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import xxhash

from proxy.turn.identity import AUTH_TENANT_HEADER, key_tenant
from proxy.settings import Settings, SettingsError
from proxy.wire.errors import ProxyError

_AUTH_TENANT = AUTH_TENANT_HEADER.encode()
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class Identity:
    tenant: str
    upstream_key: str | None  # None: the request's own Authorization goes upstream unchanged


@dataclass(frozen=True)
class VirtualKey:
    tenant: str
    upstream_key: str


def virtual_tenant(name: str) -> str:
    """The tenant id of a configured tenant name (same shape as a key's tenant, distinct prefix)."""
    return "v" + xxhash.xxh3_128_hexdigest(name.encode())[:24]


def _digest(key: str) -> str:
    return xxhash.xxh3_128_hexdigest(key.encode())


def parse_virtual_keys(text: str) -> dict[str, VirtualKey]:
    """Client key -> VirtualKey from JSON or TOML given inline or as a file path.

    Shape: ``{"<client key>": {"tenant": "<name>", "upstream_key": "<key>"}}``, optionally under a ``keys`` table.
    ``upstream_key`` may be empty or missing: the upstream then gets ``upstream_api_key`` (or no key).
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
    out: dict[str, VirtualKey] = {}
    for client_key, entry in data.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("tenant"), str) or not entry["tenant"].strip():
            raise SettingsError(f"setting 'virtual_keys': the entry of key {client_key[:4]}... needs a 'tenant' name")
        upstream_key = entry.get("upstream_key") or ""
        if not isinstance(upstream_key, str):
            raise SettingsError(f"setting 'virtual_keys': 'upstream_key' of key {client_key[:4]}... must be text")
        if not client_key.strip():
            raise SettingsError("setting 'virtual_keys': empty client key")
        out[_digest(client_key.strip())] = VirtualKey(virtual_tenant(entry["tenant"].strip()), upstream_key)
    return out


def bearer_of(headers: Mapping[str, str]) -> str:
    auth = headers.get("authorization") or headers.get("Authorization") or ""
    return auth[7:].strip() if auth[:7].lower() == "bearer " else auth.strip()


def invalid_key() -> ProxyError:
    return ProxyError(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")


class Authenticator:
    """Resolves a request's identity from its Authorization header."""

    def __init__(self, settings: Settings) -> None:
        self.mode = settings.auth_mode
        self.admin_key = settings.admin_key
        self.keys = parse_virtual_keys(settings.virtual_keys) if self.mode == "virtual_keys" else {}
        if self.mode == "virtual_keys" and not self.keys:
            raise SettingsError("setting 'virtual_keys': auth_mode virtual_keys needs at least one key")

    def is_admin(self, headers: Mapping[str, str]) -> bool:
        given = bearer_of(headers)
        return bool(self.admin_key and given) and hmac.compare_digest(given.encode(), self.admin_key.encode())

    def resolve(self, headers: Mapping[str, str]) -> Identity:
        """The caller's identity; ProxyError(401) for a key virtual_keys mode does not know."""
        key = bearer_of(headers)
        if self.mode != "virtual_keys":
            return Identity(key_tenant(key), None)
        found = self.keys.get(_digest(key)) if key else None
        if found is None:
            raise invalid_key()
        return Identity(found.tenant, found.upstream_key)


def _guarded(path: str) -> bool:
    return path.startswith("/v1/") or path.startswith("/memci/")


class AuthMiddleware:
    """ASGI middleware: resolve the tenant once, rewrite the headers the handlers and the upstream will see."""

    def __init__(self, app: Any, authenticator: Authenticator) -> None:
        self.app = app
        self.auth = authenticator

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        raw = [(k, v) for k, v in scope.get("headers", []) if k.lower() != _AUTH_TENANT]
        scope["headers"] = raw
        if not _guarded(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        if self.auth.is_admin(headers):
            await self.app(scope, receive, send)
            return
        try:
            identity = self.auth.resolve(headers)
        except ProxyError as exc:
            await send_error(send, exc)
            return
        if identity.upstream_key is not None:
            raw = [(k, v) for k, v in raw if k.lower() != b"authorization"]
            if identity.upstream_key:
                raw.append((b"authorization", f"Bearer {identity.upstream_key}".encode("latin-1")))
        raw.append((_AUTH_TENANT, identity.tenant.encode()))
        scope["headers"] = raw
        await self.app(scope, receive, send)


async def send_error(send: Any, exc: ProxyError) -> None:
    body = exc.body()
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
