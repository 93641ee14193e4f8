"""The shape of an error the proxy answers itself, by the API of the path: Anthropic's on /v1/messages (and its
count_tokens), OpenAI's everywhere else. Every place that answers an error (the routes, the middleware, the app's
exception handlers) writes its body here, so no Messages client ever reads an OpenAI-shaped error of the proxy."""

from __future__ import annotations

from memci_proxy.api.messages_codec import error_body as anthropic_error_body
from memci_proxy.wire.errors import ProxyError

MESSAGES_PATH = "/v1/messages"


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_body_for(path: str, exc: ProxyError) -> bytes:
    return anthropic_error_body(exc.status, exc.message) if is_messages_path(path) else exc.body()
