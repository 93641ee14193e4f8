"""Turning what the services return into HTTP responses (the only place that builds them for /v1)."""

from __future__ import annotations

from litestar import Request, Response
from litestar.response import Stream

from proxy.api.services import Services
from proxy.upstream.exchange import Answer


def services_of(request: Request) -> Services:
    return request.app.state.services


def respond(answer: Answer) -> Response:
    """The upstream exchange's answer as a Litestar response: a whole body, or a stream of events."""
    if answer.events is not None:
        return Stream(answer.events, status_code=answer.status, media_type=answer.media_type, headers=answer.headers)
    return Response(content=answer.body, status_code=answer.status, media_type=answer.media_type,
                    headers=answer.headers)
