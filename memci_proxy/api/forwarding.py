"""Turning what the services return into HTTP responses (the only place that builds them for /v1)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from memci_proxy.api.services import Services
from memci_proxy.upstream.exchange import Answer
from memci_proxy.wire.unpaired import to_wire


_encode = msgspec.json.Encoder().encode


def stored_text_json(content: Any, headers: Mapping[str, str] | None = None) -> Response:
    """A JSON answer holding conversation text read back from the store: its lone surrogates written as the client
    wrote them (memci_proxy.wire.unpaired), like the answers of the managed APIs."""
    return Response(content=to_wire(_encode(content)), media_type="application/json", headers=dict(headers or {}))


def services_of(request: Request) -> Services:
    return request.app.state.services


def respond(answer: Answer) -> Response:
    """The upstream exchange's answer as a Litestar response: a whole body, or a stream of events; text held in the
    proxy's internal form written back as the client wrote it (memci_proxy.wire.unpaired)."""
    if answer.internal_text:
        answer.body = to_wire(answer.body)
        answer.events = None if answer.events is None else _to_wire(answer.events)
    if answer.events is not None:
        return Stream(answer.events, status_code=answer.status, media_type=answer.media_type, headers=answer.headers)
    return Response(content=answer.body, status_code=answer.status, media_type=answer.media_type,
                    headers=answer.headers)


async def _to_wire(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield to_wire(event)
    finally:  # a client that leaves early closes the events too (the upstream request is cancelled)
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
