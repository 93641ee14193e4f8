"""What every API's route shares around its codec: the managed turn of a translated chat body, and plain forwarding
of the body as sent (pass-through mode)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import msgspec
from litestar import Request

from memci_proxy.api.auth import with_cache_salt
from memci_proxy.api.forwarding import services_of
from memci_proxy.api.limits import admit_stream
from memci_proxy.turn.call import ChatCall, chat_call
from memci_proxy.turn.identity import tenant_of
from memci_proxy.turn.prompt_count import managed_prompt_tokens
from memci_proxy.upstream.exchange import Answer, Outgoing
from memci_proxy.wire.validate import validate_chat_request

_encode = msgspec.json.Encoder().encode


def _call(request: Request, chat: dict[str, Any], started: float, headers: Mapping[str, str] | None,
          messages_param: str) -> ChatCall:
    """The turn's call of a chat body a codec built, within the limits of a chat request."""
    services = services_of(request)
    validate_chat_request(chat)
    limits = request.app.state.limits
    limits.check_messages(chat, messages_param)
    headers = request.headers if headers is None else headers
    tenant = tenant_of(headers)
    body = _encode(chat)
    if services.settings.cache_salt_per_tenant:
        body, chat = with_cache_salt(body, chat, tenant)
    # The messages' bytes, as a chat client's would be: the codecs write a conversation the same way every turn, so
    # the turn recognises it by a byte prefix (one hash pass) rather than by hashing every message again.
    raw_messages = _encode(chat["messages"])
    return chat_call(headers, chat, body, raw_messages, request.url.query, started, tenant,
                     user_secret=services.settings.user_hash_key)


async def managed_count(request: Request, chat: dict[str, Any], headers: Mapping[str, str] | None = None) -> int:
    """Tokens of the prompt the managed turn of ``chat`` would send upstream (memci_proxy.turn.prompt_count)."""
    call = _call(request, chat, time.perf_counter(), headers, "messages")
    return await managed_prompt_tokens(services_of(request).context, call)


async def managed_turn(request: Request, chat: dict[str, Any], started: float,
                       headers: Mapping[str, str] | None = None, messages_param: str = "messages") -> Answer:
    """The one managed turn for a chat-completions body a codec built (``headers``: the client's, as the codec
    adapted them for the upstream's chat completions; ``messages_param``: the client's field the messages came
    from, named by the limit's error)."""
    services = services_of(request)
    call = _call(request, chat, started, headers, messages_param)
    if chat.get("stream") is True:
        await admit_stream(request.scope, request.app.state.limits, call.tenant)
    return await services.context.handle(call)


async def forward_as_sent(request: Request, path: str, body: bytes, stream: bool, started: float | None = None
                          ) -> Answer:
    """Pass-through mode: the body to the upstream's own endpoint, unchanged."""
    services = services_of(request)
    return await services.exchange.send(Outgoing(
        "other", "POST", path, request.url.query, request.headers, body, started or time.perf_counter(), stream,
        route_key=tenant_of(request.headers)))
