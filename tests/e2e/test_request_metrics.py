"""Each /v1 request is counted once in memci_requests_total (and, for the three client APIs, memci_api_requests_total)
with its own route label and its final status: errors raised before or after the turn (400, 404, 413, 502), on
/v1/messages too, and a stream the upstream cut (``stream_cut``, so that ``status!~"2.."`` counts every failure)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.proxyproc import ProxyProcess, free_port
from tests.e2e.test_operations import eventually, metric

MAX_BODY = 200_000


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096, {"MEMCI_MAX_BODY_BYTES": str(MAX_BODY)})


def _counts(proxy: ProxyProcess) -> dict[tuple[str, str, str], float]:
    out: dict[tuple[str, str, str], float] = {}
    for line in httpx.get(proxy.url + "/metrics", timeout=5).text.splitlines():
        for name, label in (("memci_requests_total{", "route"), ("memci_api_requests_total{", "api")):
            if line.startswith(name):
                labels = dict(part.split("=", 1) for part in line[len(name):line.index("}")].split(","))
                key = (name[:-1], labels[label].strip('"'), labels["status"].strip('"'))
                out[key] = float(line.rsplit(" ", 1)[1])
    return out


def _added(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _post(proxy: ProxyProcess, path: str, **kw) -> httpx.Response:
    return httpx.post(proxy.url + path, headers={"Authorization": "Bearer sk-metrics"}, timeout=30, **kw)


MESSAGE = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "hello [[len:5]]"}]}


def test_each_request_is_counted_once_by_its_route_and_final_status(pair) -> None:
    proxy = pair.proxy
    before = _counts(proxy)
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-metrics", max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi [[len:5]]"}])
    client.responses.create(model="m", input="hi there [[len:5]]")
    assert _post(proxy, "/v1/messages", json=MESSAGE).status_code == 200
    assert _post(proxy, "/v1/messages", content=b"{not json").status_code == 400
    assert _post(proxy, "/v1/responses", json={"model": "m", "input": "x", "previous_response_id": "resp_no"}
                 ).status_code == 404
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * MAX_BODY}]}
    assert _post(proxy, "/v1/chat/completions", json=big).status_code == 413
    with httpx.stream("POST", proxy.url + "/v1/responses", headers={"Authorization": "Bearer sk-metrics"},
                      json={"model": "m", "input": "a story [[cut:3]]", "stream": True}, timeout=30) as cut:
        assert cut.status_code == 200 and "error" in cut.read().decode()  # an error event, not a whole answer
    expected = {
        ("memci_requests_total", "chat", "200"): 1, ("memci_api_requests_total", "chat", "200"): 1,
        ("memci_requests_total", "responses", "200"): 1, ("memci_api_requests_total", "responses", "200"): 1,
        ("memci_requests_total", "messages", "200"): 1, ("memci_api_requests_total", "messages", "200"): 1,
        ("memci_requests_total", "messages", "400"): 1, ("memci_api_requests_total", "messages", "400"): 1,
        ("memci_requests_total", "responses", "404"): 1, ("memci_api_requests_total", "responses", "404"): 1,
        ("memci_requests_total", "chat", "413"): 1, ("memci_api_requests_total", "chat", "413"): 1,
        ("memci_requests_total", "responses", "stream_cut"): 1,
        ("memci_api_requests_total", "responses", "stream_cut"): 1,
    }
    eventually(lambda: _added(before, _counts(proxy)) == expected)  # a stream is counted once it has ended


def test_an_unreachable_upstream_is_a_502_of_each_api() -> None:
    home = Path(tempfile.mkdtemp(prefix="memci-e2e-metrics-"))
    proxy = ProxyProcess(f"http://127.0.0.1:{free_port()}/v1", home).start()
    try:
        assert _post(proxy, "/v1/messages", json=MESSAGE).status_code == 502
        assert _post(proxy, "/v1/responses", json={"model": "m", "input": "hi"}).status_code == 502
        assert metric(proxy, "memci_requests_total", route="messages", status="502") == 1
        assert metric(proxy, "memci_api_requests_total", api="messages", status="502") == 1
        assert metric(proxy, "memci_requests_total", route="responses", status="502") == 1
        assert metric(proxy, "memci_requests_total", route="other") == 0
    finally:
        proxy.stop()
        shutil.rmtree(home, ignore_errors=True)
