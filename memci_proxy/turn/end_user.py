"""Whose memory a request touches: the end user, named explicitly by the client, never guessed.

A tenant is an app (one API key for all its users); the end user is the person. Read from, in order: the header
``X-Memci-User``, the body's ``safety_identifier`` (OpenAI's successor of ``user``), its ``user`` (chat completions
and Responses; the Messages codec maps Anthropic's ``metadata.user_id`` to it). Kept only as a keyed hash per
tenant (``user_key``): the same person under two tenants has two unrelated keys, and the id itself is never
stored or logged. No id: the empty key, and nothing of the conversation leaves it (memci_proxy.turn.service).

A virtual key bound to one user (``/memci/keys`` with ``user``) IS that user: memci_proxy.api.auth writes the key's
stored hash into ``AUTH_USER_HEADER`` (a client's own copy is always dropped), and it overrides all of the above.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

USER_HEADER = "x-memci-user"
# Set by memci_proxy.api.auth.AuthMiddleware for a virtual key bound to one end user: that user's key (user_key).
AUTH_USER_HEADER = "x-memci-auth-user"
MAX_USER_ID_CHARS = 512  # longer ids are refused (a 400 naming the field)
_BODY_FIELDS = ("safety_identifier", "user")


class EndUserError(ValueError):
    """An end-user id that cannot be one (not text, or too long); ``param`` names where it came from."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def end_user_id(headers: Mapping[str, str], data: Mapping[str, Any]) -> tuple[str, str]:
    """(the id as sent, where it came from); ("", "") when the request names none. Raises EndUserError."""
    header = headers.get(USER_HEADER) or headers.get("X-Memci-User")
    if header is not None and header.strip():
        return _checked(header.strip(), "X-Memci-User"), "X-Memci-User"
    for name in _BODY_FIELDS:
        value = data.get(name)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise EndUserError(f"'{name}' must be a string", name)
        if value.strip():
            return _checked(value.strip(), name), name
    return "", ""


def bound_user(headers: Mapping[str, str]) -> str:
    """The end user's key of the request's virtual key when it is bound to one (already hashed), else ""."""
    return (headers.get(AUTH_USER_HEADER) or headers.get("X-Memci-Auth-User") or "").strip()


def _checked(value: str, param: str) -> str:
    if len(value) > MAX_USER_ID_CHARS:
        raise EndUserError(f"'{param}' is longer than {MAX_USER_ID_CHARS} characters", param)
    return value


def user_key(tenant: str, user_id: str, secret: str = "") -> str:
    """The stored form of an end user: a keyed BLAKE2b of (tenant, id), ``secret`` the deployment's key
    (setting ``user_hash_key``). '' for no id."""
    if not user_id:
        return ""
    key = hashlib.blake2b(secret.encode(), digest_size=32, person=b"memci-user").digest()
    digest = hashlib.blake2b(f"{tenant}\0{user_id}".encode("utf-8", "surrogatepass"), key=key, digest_size=12)
    return "u" + digest.hexdigest()
