"""The one check of the chat route (memci_proxy.upstream.route_check): its verdicts, its cache for `/ready`, and doctor
judging with it (the end-to-end runs of /ready and doctor are in tests/e2e/test_operations.py)."""

from __future__ import annotations

import asyncio

import httpx

from memci_proxy import doctor
from memci_proxy.settings import load_settings
from memci_proxy.upstream import route_check
from memci_proxy.upstream.route_check import RouteWatch, judge, ready
from memci_proxy.wire.errors import upstream_unreachable

NO_ROUTE = b'{"error":{"message":"no route for POST /chat/completions","type":"not_found_error"}}'


def test_a_base_url_without_v1_gets_a_hint() -> None:
    verdict = judge("http://host:8000", 404, NO_ROUTE)
    assert not verdict.ok and verdict.reachable
    assert verdict.message == ("the upstream has no /chat/completions under http://host:8000 (HTTP 404) — did you mean "
                               "http://host:8000/v1?")
    assert "did you mean" not in judge("http://host:8000/v1", 404, b"Not Found").message
    assert not judge("http://host:8000", 405, b"").ok


def test_an_answer_to_the_empty_request_means_the_route_is_there() -> None:
    for status in (400, 401, 422, 200, 500):
        assert judge("http://h/v1", status, b"").ok
    # a 404 about the model (vLLM's "The model `x` does not exist") is the route answering
    assert judge("http://h/v1", 404, b'{"message": "The model `m` does not exist."}').ok
    assert not judge("http://h/v1", 503, b"").ok


def test_ready_tolerates_a_worker_down_but_not_a_worker_without_the_route() -> None:
    ok, down = judge("http://a/v1", 400), route_check.unreachable("http://b/v1", "refused")
    assert ready([ok, down]) and not ready([down])
    assert not ready([ok, judge("http://c", 404)])


class CountingUpstream:
    """memci_proxy.upstream.port.Upstream's send, counting probes; answers ``status`` or raises when ``down``."""

    def __init__(self, status: int = 400) -> None:
        self.status, self.down, self.calls = status, False, 0

    def forward_headers(self, incoming):
        return dict(incoming)

    async def send(self, method, url, headers, body):
        self.calls += 1
        assert (method, body) == ("POST", b'{"messages": null}') and url.endswith("/chat/completions")
        if self.down:
            raise upstream_unreachable("connection refused")
        upstream = self

        class Response:
            status = upstream.status

            async def read(self):
                return NO_ROUTE

            def release(self):
                pass

        return Response(), 0.001


async def test_the_watch_probes_each_worker_once_per_ttl() -> None:
    client = CountingUpstream()
    watch = RouteWatch(client, ["http://a/v1", "http://b/v1"], ttl_s=0.2)
    results = await asyncio.gather(*(watch.verdicts() for _ in range(20)))  # a burst of /ready polls
    assert client.calls == 2 and all(ready(r) for r in results)
    client.down = True
    assert ready(await watch.verdicts()) and client.calls == 2  # cached
    await asyncio.sleep(0.25)
    verdicts = await watch.verdicts()
    assert client.calls == 4 and not ready(verdicts) and "unreachable" in verdicts[0].message


def _doctor(url: str, transport: httpx.MockTransport) -> list[tuple[str, str]]:
    report = doctor.Report(say=lambda line: None)
    doctor.check_upstream(load_settings(env={"MEMCI_UPSTREAM_URL": url}, read_file=False), report, transport=transport)
    return report.lines


def test_doctor_fails_a_base_url_without_v1_with_the_same_message() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(404, content=NO_ROUTE)

    lines = _doctor("http://up.test", httpx.MockTransport(handle))
    assert lines == [("FAIL", "upstream http://up.test: " + judge("http://up.test", 404, NO_ROUTE).message)]
