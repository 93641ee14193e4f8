"""POST /memci/rewrite: the standalone query of a chat request's latest user message, and the level that served."""

from __future__ import annotations

from litestar import Request, Response, post

from memci_proxy.api.forwarding import services_of
from memci_proxy.turn.identity import split_system
from memci_proxy.turn.call import REWRITE_MODES
from memci_proxy.wire.errors import ProxyError, bad_request
from memci_proxy.wire.validate import parse_json_object, validate_chat_request


@post("/memci/rewrite", status_code=200)
async def rewrite_endpoint(request: Request) -> Response:
    services = services_of(request)
    if services.context is None:
        raise ProxyError(404, "the rewrite needs context management on", "invalid_request_error", "context_off")
    data = parse_json_object(await request.body())
    validate_chat_request(data)
    mode = data.get("mode", "model")
    if mode not in REWRITE_MODES or mode == "off":
        raise bad_request("'mode' must be 'model' or 'rules'", param="mode")
    _, messages = split_system(data["messages"])
    if not messages or messages[-1].get("role") != "user":
        raise bad_request("the last message must be the user's", param="messages")
    result = await services.context.volatile.rewrite(messages, mode)
    assert result is not None
    return Response(content={"query": result.query, "level": result.level, "changed": result.changed,
                             "reason": result.reason})


REWRITE_ROUTES = [rewrite_endpoint]
