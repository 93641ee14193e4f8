"""Who is asking (tenant) and which conversation a request continues (session key or message prefix)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import xxhash

ANONYMOUS = "anonymous"
_SYSTEM_ROLES = ("system", "developer")
# Set by proxy.api.auth.AuthMiddleware on every /v1 and /memci request (a client's own copy is dropped there).
AUTH_TENANT_HEADER = "x-memci-auth-tenant"


def tenant_of(headers: Mapping[str, str]) -> str:
    """The request's tenant as proxy.api.auth resolved it (auth mode, virtual keys).

    Without that header (a caller outside the HTTP app), pass-through bearer mode: a hash of the client's key.
    """
    resolved = headers.get(AUTH_TENANT_HEADER) or headers.get("X-Memci-Auth-Tenant")
    if resolved:
        return resolved
    auth = headers.get("authorization") or headers.get("Authorization") or ""
    return key_tenant(auth[7:].strip() if auth[:7].lower() == "bearer " else auth.strip())


def key_tenant(key: str) -> str:
    """Pass-through bearer mode: the tenant is a hash of the client's API key (never the key itself)."""
    if not key:
        return ANONYMOUS
    return "t" + xxhash.xxh3_128_hexdigest(key.encode())[:24]


def session_key_of(headers: Mapping[str, str], data: Mapping[str, Any]) -> str | None:
    """An explicit conversation key: header X-Session-Id, else ``prompt_cache_key``, else metadata."""
    key = headers.get("x-session-id") or headers.get("X-Session-Id")
    if key:
        return key.strip()[:256] or None
    pck = data.get("prompt_cache_key")
    if isinstance(pck, str) and pck.strip():
        return pck.strip()[:256]
    metadata = data.get("metadata")
    if isinstance(metadata, Mapping):
        for name in ("session_id", "conversation_id"):
            value = metadata.get(name)
            if isinstance(value, str) and value.strip():
                return value.strip()[:256]
    return None


def conversation_id_for_session(tenant: str, session_key: str) -> str:
    """Deterministic, so every replica derives the same id for one session key."""
    return "s" + xxhash.xxh3_128_hexdigest(f"{tenant}\0{session_key}".encode())[:24]


def new_conversation_id() -> str:
    return "c" + uuid.uuid4().hex[:24]


def split_system(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The leading run of system/developer messages (block B1, not part of the identity), and the rest."""
    i = 0
    while i < len(messages) and messages[i].get("role") in _SYSTEM_ROLES:
        i += 1
    return messages[:i], messages[i:]
