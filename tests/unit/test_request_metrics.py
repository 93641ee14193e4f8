"""The edge's count of each /v1 request: an error no handler answered is a 500, counted once."""

from __future__ import annotations

import pytest

from memci_proxy.api.request_metrics import RequestMetricsMiddleware
from memci_proxy.metrics import Metrics


async def test_an_error_that_escapes_every_handler_counts_as_a_500() -> None:
    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    async def send(message):
        pass

    metrics = Metrics()
    with pytest.raises(RuntimeError):
        await RequestMetricsMiddleware(broken, metrics)({"type": "http", "path": "/v1/messages"}, None, send)
    assert metrics.requests.labels("messages", "500")._value.get() == 1
    assert metrics.api_requests.labels("messages", "500")._value.get() == 1
