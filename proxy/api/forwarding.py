"""Forwarding one request upstream and answering the client with what came back."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from proxy.api.services import Services
from proxy.upstream.client import response_headers
from proxy.upstream.relay import relay_sse
from proxy.wire.errors import ProxyError

_decode = msgspec.json.Decoder().decode


def services_of(request: Request) -> Services:
    return request.app.state.services


def error_response(exc: ProxyError) -> Response:
    return Response(
        content=exc.body(), status_code=exc.status, media_type="application/json", headers=exc.headers or None
    )


def usage_of_body(body: bytes) -> dict | None:
    if b'"usage"' not in body:
        return None
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        return None
    usage = data.get("usage") if isinstance(data, dict) else None
    return usage if isinstance(usage, dict) else None


async def forward(
    services: Services,
    route: str,
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    body: bytes | None,
    started: float,
    expect_stream: bool = False,
    extra_headers: Mapping[str, str] | None = None,
    on_usage: Callable[[dict], None] | None = None,
    route_key: str | None = None,
) -> Response:
    """Send upstream and relay the answer: status, headers and body unchanged; SSE event by event."""
    m = services.metrics
    upstream = services.upstream
    url = upstream.url(path, query, route_key)
    response, waited = await upstream.send(method, url, upstream.forward_headers(headers), body)
    out_headers = response_headers(response.headers)
    if extra_headers:
        out_headers.update(extra_headers)
    content_type = response.headers.get("Content-Type", "")
    if expect_stream and response.status == 200 and content_type.startswith("text/event-stream"):
        sent_at = time.perf_counter() - waited
        m.proxy_overhead.labels(route).observe(max(0.0, sent_at - started))

        def first_byte() -> None:
            m.upstream_ttft.observe(time.perf_counter() - sent_at)

        def usage_seen(usage: dict) -> None:
            m.observe_usage(usage)
            if on_usage is not None:
                on_usage(usage)

        def finished() -> None:
            m.request_duration.labels(route).observe(time.perf_counter() - started)

        out_headers.pop("Content-Type", None)
        m.requests.labels(route, "200").inc()
        return Stream(
            _timed(relay_sse(response, m, first_byte, usage_seen), finished),
            status_code=200,
            media_type="text/event-stream",
            headers={**out_headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    m.upstream_ttft.observe(waited)
    read_started = time.perf_counter()
    content = await upstream.read_body(response)
    upstream_time = waited + (time.perf_counter() - read_started)
    if response.status == 200 and route == "chat":
        usage = usage_of_body(content)
        if usage is not None:
            m.observe_usage(usage)
            if on_usage is not None:
                on_usage(usage)
    total = time.perf_counter() - started
    m.proxy_overhead.labels(route).observe(max(0.0, total - upstream_time))
    m.request_duration.labels(route).observe(total)
    m.requests.labels(route, str(response.status)).inc()
    out_headers.pop("Content-Type", None)
    return Response(
        content=content, status_code=response.status, media_type=content_type or None, headers=out_headers
    )


async def _timed(events, on_done: Callable[[], None]):
    try:
        async for event in events:
            yield event
    finally:
        on_done()
