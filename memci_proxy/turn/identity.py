"""Who is asking (tenant) and which conversation a request continues (session key or message prefix)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import xxhash

from memci_proxy.engine.fingerprint import advance_prefix, entry_digest
from memci_proxy.engine.state import ConversationState, common_prefix_of_blobs

ANONYMOUS = "anonymous"
_SYSTEM_ROLES = ("system", "developer")
# Set by memci_proxy.api.auth.AuthMiddleware on every /v1 and /memci request (a client's own copy is dropped there).
AUTH_TENANT_HEADER = "x-memci-auth-tenant"


def tenant_of(headers: Mapping[str, str]) -> str:
    """The request's tenant as memci_proxy.api.auth resolved it (auth mode, virtual keys).

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


def conversation_id_for_session(tenant: str, session_key: str, end_user: str = "") -> str:
    """Deterministic, so every replica derives the same id for one session key; one end user's session key names
    another conversation than the same key of another user (``end_user``: memci_proxy.turn.end_user.user_key)."""
    scope = f"{tenant}\0{end_user}" if end_user else tenant
    return "s" + xxhash.xxh3_128_hexdigest(f"{scope}\0{session_key}".encode())[:24]


def new_conversation_id() -> str:
    return "c" + uuid.uuid4().hex[:24]


def pass_through_route_key(tenant: str, headers: Mapping[str, str], data: Mapping[str, Any]) -> str:
    """A routing key for a chat request without a conversation id: the session key, else the first message.

    Every turn of a conversation resends its first non-system message, so the key stays the same.
    """
    session = session_key_of(headers, data)
    if session:
        return f"{tenant}\0s\0{session}"
    messages = data.get("messages")
    first: Any = None
    if isinstance(messages, list):
        _, rest = split_system([m for m in messages if isinstance(m, dict)])
        first = rest[0] if rest else (messages[0] if messages else None)
    digest = xxhash.xxh3_64_hexdigest(repr(first).encode())
    return f"{tenant}\0m\0{digest}"


def split_system(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The leading run of system/developer messages (block B1, not part of the identity), and the rest."""
    i = 0
    while i < len(messages) and messages[i].get("role") in _SYSTEM_ROLES:
        i += 1
    return messages[:i], messages[i:]


def continues(state: ConversationState, messages: list[dict[str, Any]], raw_messages: Any = None) -> bool:
    """Whether the request's messages (after the leading system ones) start with every entry of the state: a
    continuation, not an edit. The raw bytes are compared first (one hash pass); then the entries' hashes."""
    if state.messages_kind == "raw" and raw_messages is not None:
        if advance_prefix(raw_messages, state.messages_length, state.messages_digest)[0]:
            return True
    known = state.entry_count
    if len(messages) < known:
        return False
    digests = b"".join(entry_digest(m) for m in messages[:known])
    return common_prefix_of_blobs(state.hash_blob, digests) >= known
