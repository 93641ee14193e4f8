"""The typed call object: one chat completion request as the turn needs it, built once by the route."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memci_proxy.turn.end_user import EndUserError, bound_user, end_user_id, user_key
from memci_proxy.turn.identity import session_key_of, tenant_of
from memci_proxy.wire.errors import bad_request

REWRITE_MODES = ("off", "rules", "model")


@dataclass(slots=True)
class ChatCall:
    tenant: str
    session_key: str | None  # an explicit conversation key (X-Session-Id, prompt_cache_key, metadata)
    headers: Mapping[str, str]  # the client's headers, forwarded upstream
    data: dict[str, Any]  # the parsed body
    body: bytes  # the body as the upstream gets it when the turn leaves it unchanged
    raw_messages: Any  # the bytes of the body's `messages` value as sent (a buffer), or None
    stream: bool
    query: str = ""  # the request URL's query string, passed on
    started: float = 0.0  # time.perf_counter() when the request arrived
    rewrite_mode: str = ""  # X-Memci-Rewrite for this request: "", "off", "rules" or "model"
    memory_mode: str = ""  # X-Memci-Memory for this request: "", "on" or "off"
    offload_mode: str = ""  # X-Memci-Offload for this request: "", "on" or "off"
    end_user: str = ""  # the end user's keyed hash (memci_proxy.turn.end_user), "" when the request names none

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.data["messages"]


def _header(headers: Mapping[str, str], name: str) -> str:
    return (headers.get(name) or headers.get(name.lower()) or "").strip().lower()


def chat_call(
    headers: Mapping[str, str], data: dict[str, Any], body: bytes, raw_messages: Any, query: str = "",
    started: float = 0.0, tenant: str | None = None, user_secret: str = "",
) -> ChatCall:
    rewrite = _header(headers, "X-Memci-Rewrite")
    memory = _header(headers, "X-Memci-Memory")
    offload = _header(headers, "X-Memci-Offload")
    if offload not in ("", "on", "off"):
        raise bad_request(f"X-Memci-Offload must be 'on' or 'off', not {offload!r}", param="X-Memci-Offload",
                          code="invalid_header")
    tenant = tenant if tenant is not None else tenant_of(headers)
    end_user = bound_user(headers) or _named_user(headers, data, tenant, user_secret)
    return ChatCall(
        tenant=tenant,
        session_key=session_key_of(headers, data),
        headers=headers,
        data=data,
        body=body,
        raw_messages=raw_messages,
        stream=data.get("stream") is True,
        query=query,
        started=started,
        rewrite_mode=rewrite if rewrite in REWRITE_MODES else "",
        memory_mode=memory if memory in ("on", "off") else "",
        offload_mode=offload,
        end_user=end_user,
    )


def _named_user(headers: Mapping[str, str], data: Mapping[str, Any], tenant: str, secret: str) -> str:
    """The key of the end user the request names (X-Memci-User, safety_identifier, user), "" for none."""
    try:
        user_id, _ = end_user_id(headers, data)
    except EndUserError as exc:
        raise bad_request(str(exc), param=exc.param, code="invalid_user") from None
    return user_key(tenant, user_id, secret)
