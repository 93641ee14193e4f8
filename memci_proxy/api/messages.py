"""`POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API, managed through the one turn
service (memci_proxy.api.messages_codec in and out), its errors in Anthropic's shape; in pass-through mode the body goes
to the upstream's own /v1/messages unchanged."""

from __future__ import annotations

import time
from collections.abc import Mapping

import msgspec
from litestar import Request, Response, post

from memci_proxy.api.api_metrics import metered
from memci_proxy.api.error_shapes import error_body_for
from memci_proxy.api.edge import forward_as_sent, managed_count, managed_turn
from memci_proxy.api.forwarding import respond, services_of
from memci_proxy.api.messages_codec import (
    chat_request, chat_tools, error_of_openai, message_of, prompt_messages,
)
from memci_proxy.api.messages_stream import message_events
from memci_proxy.upstream.exchange import Answer
from memci_proxy.wire.chunks import completion_of_body
from memci_proxy.wire.errors import ProxyError
from memci_proxy.wire.unpaired import to_internal
from memci_proxy.wire.validate import parse_json_object

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
# Anthropic's own headers stay here: the upstream's chat completions gets the key as a bearer token.
_ANTHROPIC_HEADERS = ("x-api-key", "anthropic-version", "anthropic-beta", "anthropic-dangerous-direct-browser-access")


def chat_headers(headers: Mapping[str, str]) -> dict[str, str]:
    out = {k.lower(): v for k, v in headers.items() if k.lower() not in _ANTHROPIC_HEADERS}
    key = headers.get("x-api-key")
    if key and "authorization" not in out:
        out["authorization"] = f"Bearer {key}"
    return out


def _error(request: Request, exc: ProxyError) -> Response:
    return Response(content=error_body_for(request.url.path, exc), status_code=exc.status,
                    media_type="application/json", headers=exc.headers or None)


def _anthropic_errors(answer: Answer) -> Answer:
    if answer.events is None and answer.status != 200:
        answer.body = error_of_openai(answer.status, answer.body)
        answer.media_type = "application/json"
    return answer


@post("/v1/messages", status_code=200)
async def create_message(request: Request) -> Response:
    started = time.perf_counter()
    try:
        services = services_of(request)
        body = await request.body()
        data = parse_json_object(to_internal(body))  # lone surrogates as text the proxy can hold (memci_proxy.wire.unpaired)
        stream = data.get("stream") is True
        if services.context is None:
            return respond(await forward_as_sent(request, "/messages", body, stream, started))
        answer = await managed_turn(request, chat_request(data), started, chat_headers(request.headers))
    except ProxyError as exc:
        return _error(request, exc)
    answer = metered(answer, services.metrics, "messages")
    model = str(data.get("model") or "")
    if answer.events is not None:
        answer.events = message_events(model, answer.events)
    elif answer.status == 200:
        answer.body = _encode(message_of(completion_of_body(_decode(answer.body)), model))
        answer.media_type = "application/json"
    return respond(_anthropic_errors(answer))


@post("/v1/messages/count_tokens", status_code=200)
async def count_tokens(request: Request) -> Response:
    try:
        services = services_of(request)
        body = await request.body()
        data = parse_json_object(to_internal(body))
        if services.context is None:
            return respond(_anthropic_errors(await forward_as_sent(request, "/messages/count_tokens", body, False)))
        # the prompt the turn would send (pages archived, outputs offloaded, the recall tool), not the client's
        # history; within the limits of a chat request: counting is no cheaper
        chat = {"model": data.get("model"), "messages": prompt_messages(data)}
        if data.get("tools"):
            chat["tools"] = chat_tools(data["tools"])
        count = await managed_count(request, chat, chat_headers(request.headers))
    except ProxyError as exc:
        return _error(request, exc)
    return Response(content={"input_tokens": count}, status_code=200)


MESSAGES_ROUTES = [create_message, count_tokens]
