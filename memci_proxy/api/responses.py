"""`POST /v1/responses`: the Responses API, managed through the one turn service (memci_proxy.api.responses_codec in and
out); in pass-through mode the body goes to the upstream's own /v1/responses unchanged."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from litestar import Request, Response, post

from memci_proxy.api.api_metrics import metered
from memci_proxy.api.edge import forward_as_sent, managed_turn
from memci_proxy.api.forwarding import respond, services_of
from memci_proxy.api.response_chain import ResponseChain
from memci_proxy.api.responses_codec import (assistant_messages, chat_request, input_messages, new_id, response_of,
                                       tool_names)
from memci_proxy.api.responses_stream import response_events
from memci_proxy.turn.identity import tenant_of
from memci_proxy.upstream.exchange import Answer
from memci_proxy.wire.chunks import completion_of_body
from memci_proxy.wire.errors import bad_request
from memci_proxy.wire.unpaired import to_internal
from memci_proxy.wire.validate import parse_json_object

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def response_chain(request: Request) -> ResponseChain:
    services = services_of(request)
    if services.response_chain is None:
        services.response_chain = ResponseChain(getattr(services.store, "chains", None))
    return services.response_chain


@post("/v1/responses", status_code=200)
async def create_response(request: Request) -> Response:
    started = time.perf_counter()
    services = services_of(request)
    body = await request.body()
    data = parse_json_object(to_internal(body))  # lone surrogates as text the proxy can hold (memci_proxy.wire.unpaired)
    stream = data.get("stream") is True
    if services.context is None:
        return respond(await forward_as_sent(request, "/responses", body, stream, started))
    tenant = tenant_of(request.headers)
    previous = data.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise bad_request("'previous_response_id' must be a string", param="previous_response_id")
    chain = response_chain(request)
    history = await chain.messages(tenant, previous) if previous else []
    names = tool_names(data.get("tools"))  # namespaced functions' upstream names
    new = input_messages(data.get("input"), names)
    if not new and not history:
        raise bad_request("'input' must contain at least one item", param="input")
    answer = await managed_turn(request, chat_request(data, [*history, *new]), started, messages_param="input")
    response_id = new_id("resp")
    store = data.get("store") is not False

    conversation_id = answer.headers.get("X-Memci-Conversation-Id")

    async def keep(response: dict[str, Any]) -> None:
        if store:
            added = [*new, *assistant_messages(response["output"], names)]
            await chain.keep(tenant, response_id, previous, history, added, conversation_id)

    answer = metered(answer, services.metrics, "responses")
    return respond(await _translated(answer, data, response_id, keep))


async def _translated(answer: Answer, data: dict[str, Any], response_id: str, keep: Any) -> Answer:
    if answer.events is not None:
        answer.events = response_events(data, response_id, answer.events, keep)
        return answer
    if answer.status != 200:  # an OpenAI-style error body: the Responses API's error shape too
        return answer
    response = response_of(data, response_id, completion_of_body(_decode(answer.body)))
    await keep(response)
    answer.body = _encode(response)
    answer.media_type = "application/json"
    return answer


RESPONSES_ROUTES = [create_response]
