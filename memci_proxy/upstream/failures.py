"""Upstream failures, made visible: one WARNING line and one count per failure.

Every failure of an upstream request the proxy relays comes through ``Failures.report``: it could not connect, it
timed out, it answered a 4xx/5xx status, or its stream ended early. The line says the kind, the status, the route
and the conversation id (``-`` for pass-through requests, which have none), never message content: the upstream's
error body is passed on to the client, not logged. Nothing here runs on a request that succeeds.
"""

from __future__ import annotations

import logging

from memci_proxy.metrics import Metrics

log = logging.getLogger("memci.upstream")

# memci_upstream_errors_total{kind}: every kind the proxy counts (docs/metrics.md).
KINDS = ("unreachable", "connect_timeout", "timeout", "http_4xx", "http_5xx", "stream_cut", "stream_error")
# ProxyError codes of the upstream client -> kind.
_KIND_OF_CODE = {
    "upstream_unreachable": "unreachable",
    "upstream_connect_timeout": "connect_timeout",
    "upstream_timeout": "timeout",
    "upstream_cut": "stream_cut",
}
# memci_requests_total{status}: a stream that started (200) and ended with an upstream failure.
STREAM_FAILED_STATUS = "stream_cut"


def kind_of_status(status: int) -> str:
    return "http_5xx" if status >= 500 else "http_4xx"


def kind_of_code(code: str | None) -> str:
    return _KIND_OF_CODE.get(code or "", "unreachable")


class Failures:
    """Counts and logs upstream failures (``memci_upstream_errors_total{kind}`` and a WARNING line each)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def report(self, kind: str, status: int | None, route: str, conversation: str | None, detail: str = "") -> None:
        m = self.metrics
        m.child(m.upstream_errors, kind).inc()
        log.warning("upstream failure: %s, status %s, route %s, conversation %s%s", kind,
                    status if status is not None else "-", route, conversation or "-",
                    f" ({detail})" if detail else "")

    def status(self, status: int, route: str, conversation: str | None) -> None:
        """The upstream answered an error status (its body goes to the client unchanged)."""
        self.report(kind_of_status(status), status, route, conversation)
