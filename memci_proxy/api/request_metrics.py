"""Each /v1 request counted once, at the edge, by its route and its final status (``memci_requests_total``,
``memci_request_duration_seconds``; and ``memci_api_requests_total`` / ``_duration_seconds`` for the client APIs):
whatever answered it (a handler, an error raised before or after the turn, auth, the limits, the body-size check,
an unhandled error) and, for a stream, how it ended: ``stream_cut`` when the upstream failed after the status 200
was sent (memci_proxy.upstream.outcome)."""

from __future__ import annotations

import time
from typing import Any

from memci_proxy.api.api_metrics import API_OF_PATH
from memci_proxy.metrics import Metrics
from memci_proxy.upstream import outcome
from memci_proxy.upstream.failures import STREAM_FAILED_STATUS


def route_of(path: str) -> str:
    """The ``route`` label: the client API of the path, else ``other``."""
    return API_OF_PATH.get(path, "other")


class RequestMetricsMiddleware:
    """Outermost ASGI middleware on /v1: the status of ``http.response.start``, counted when the answer ends."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope.get("type") != "http" or not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        ended = outcome.begin()
        status: list[int] = []

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            final: int | str = status[0] if status else 500  # nothing sent: an error escaped every handler
            if ended.stream_failed:
                final = STREAM_FAILED_STATUS
            self._count(path, str(final), time.perf_counter() - started)

    def _count(self, path: str, status: str, seconds: float) -> None:
        m = self.metrics
        route = route_of(path)
        m.child(m.requests, route, status).inc()
        m.child(m.request_duration, route).observe(seconds)
        api = API_OF_PATH.get(path)
        if api is not None:
            m.child(m.api_requests, api, status).inc()
            m.child(m.api_request_duration, api).observe(seconds)
