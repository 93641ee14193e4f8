"""Auth and limits end to end: the openai SDK -> a proxy process -> an upstream (emulator or a header recorder).

The emulator's /emulator/requests log records bodies only, so the key check also runs against a small
recording upstream in this file that keeps every request's headers.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from memci_proxy.upstream import route_check
from tests.e2e.proxyproc import ProxyProcess

VIRTUAL_KEYS = {
    "sk-client-alice": {"tenant": "acme", "upstream_key": "sk-upstream-acme"},
    "sk-client-bob": {"tenant": "globex", "upstream_key": "sk-upstream-globex"},
}
CLIENT_KEYS = tuple(VIRTUAL_KEYS)


class RecordingUpstream:
    """An OpenAI-compatible upstream that records every request's headers and body."""

    def __init__(self) -> None:
        self.seen: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                recorder.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": b""})
                self._reply({"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 8192}]})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                self._reply({
                    "id": "x", "object": "chat.completion", "created": 0, "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
                })

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "RecordingUpstream":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def sdk(proxy: ProxyProcess, key: str, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0, timeout=30, **kw)


def ask(client: openai.OpenAI, text: str, **kw):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], **kw)


@pytest.mark.parametrize("manage_context", ["false", "true"])
def test_virtual_keys_never_reach_the_upstream(tmp_path, manage_context):
    with RecordingUpstream() as upstream:
        env = {"MEMCI_MANAGE_CONTEXT": manage_context, "MEMCI_AUTH_MODE": "virtual_keys",
               "MEMCI_VIRTUAL_KEYS": json.dumps(VIRTUAL_KEYS), "MEMCI_INTENT_REWRITE_ENABLED": "false"}
        proxy = ProxyProcess(upstream.base_url, tmp_path / "p", env).start()
        try:
            for key in CLIENT_KEYS:
                client = sdk(proxy, key)
                assert ask(client, f"hello from tenant {CLIENT_KEYS.index(key)}").choices[0].message.content == "ok"
                assert [m.id for m in client.models.list()] == ["m"]
                client.close()
            with pytest.raises(openai.AuthenticationError) as info:
                ask(sdk(proxy, "sk-unknown"), "let me in")
            assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
        finally:
            proxy.stop()
    # (the route check's probe, without messages, is not a chat)
    chats = [r for r in upstream.seen if r["path"].endswith("/chat/completions") and r["body"] != route_check.BODY]
    assert len(chats) == 2  # the unknown key never reached the upstream
    keys_seen = {r["headers"].get("authorization") for r in upstream.seen if r["path"].startswith("/v1/")}
    assert {"Bearer sk-upstream-acme", "Bearer sk-upstream-globex"} <= keys_seen
    everything = json.dumps([{**r, "body": r["body"].decode()} for r in upstream.seen])
    for key in (*CLIENT_KEYS, "sk-unknown"):
        assert key not in everything
    assert "x-memci-auth-tenant" not in everything.lower()


@pytest.fixture(scope="module")
def salted_proxy(emulator, tmp_path_factory):
    env = {"MEMCI_MANAGE_CONTEXT": "false", "MEMCI_AUTH_MODE": "virtual_keys",
           "MEMCI_VIRTUAL_KEYS": json.dumps(VIRTUAL_KEYS), "MEMCI_CACHE_SALT_PER_TENANT": "true"}
    p = ProxyProcess(emulator.base_url, tmp_path_factory.mktemp("salted"), env).start()
    yield p
    p.stop()


def test_cache_salt_differs_by_tenant_and_the_body_never_holds_the_key(salted_proxy, emulator):
    for key in CLIENT_KEYS:
        client = sdk(salted_proxy, key)
        ask(client, "the same prompt for both tenants")
        client.close()
    first, second = (r["body"] for r in emulator.requests(2))
    assert first["messages"] == second["messages"]
    assert first["cache_salt"] and second["cache_salt"] and first["cache_salt"] != second["cache_salt"]
    assert not any(key in json.dumps([first, second]) for key in CLIENT_KEYS)


def test_rate_limit_is_429_with_retry_after(emulator, tmp_path):
    env = {"MEMCI_MANAGE_CONTEXT": "false", "MEMCI_RATE_LIMIT_RPS": "0.05", "MEMCI_RATE_LIMIT_BURST": "2"}
    proxy = ProxyProcess(emulator.base_url, tmp_path / "p", env).start()
    try:
        client = sdk(proxy, "sk-rate-a")
        ask(client, "one")
        ask(client, "two")
        with pytest.raises(openai.RateLimitError) as info:
            ask(client, "three")
        assert info.value.status_code == 429 and info.value.code == "rate_limit_exceeded"
        assert int(info.value.response.headers["Retry-After"]) >= 15
        ask(sdk(proxy, "sk-rate-b"), "another tenant has its own bucket")
        with pytest.raises(openai.RateLimitError):
            client.models.list()  # every /v1 route counts
        metrics = httpx.get(proxy.url + "/metrics").text
        assert 'memci_limit_rejections_total{reason="rate"} 2.0' in metrics
    finally:
        proxy.stop()


def test_upstream_concurrency_is_429_past_the_bounded_queue(emulator, tmp_path):
    env = {"MEMCI_MANAGE_CONTEXT": "false", "MEMCI_UPSTREAM_MAX_INFLIGHT": "1",
           "MEMCI_UPSTREAM_QUEUE_TIMEOUT_MS": "300", "MEMCI_UPSTREAM_MAX_QUEUE": "4"}
    proxy = ProxyProcess(emulator.base_url, tmp_path / "p", env).start()
    try:
        client = sdk(proxy, "sk-busy")
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(ask, client, "hold the only slot [[delay:2]]")
            time.sleep(0.5)
            started = time.monotonic()
            with pytest.raises(openai.RateLimitError) as info:
                ask(sdk(proxy, "sk-other"), "no slot left")
            waited = time.monotonic() - started
            assert info.value.response.headers["Retry-After"] == "1"
            assert info.value.code == "rate_limit_exceeded"
            assert 0.25 < waited < 1.5  # waited in the queue, bounded by the time-out
            assert slow.result(timeout=10).choices[0].message.content
        ask(client, "the slot is free again")
        metrics = httpx.get(proxy.url + "/metrics").text
        assert 'memci_limit_rejections_total{reason="upstream_queue_timeout"} 1.0' in metrics
    finally:
        proxy.stop()


def test_concurrent_streams_per_tenant_and_message_count(emulator, tmp_path):
    env = {"MEMCI_MANAGE_CONTEXT": "false", "MEMCI_MAX_CONCURRENT_STREAMS_PER_TENANT": "1",
           "MEMCI_MAX_MESSAGES": "3"}
    proxy = ProxyProcess(emulator.base_url, tmp_path / "p", env).start()
    try:
        client = sdk(proxy, "sk-streams")
        stream = ask(client, "a slow stream [[slow:0.2]] [[len:10]]", stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as info:
            ask(client, "a second stream", stream=True)
        assert info.value.code == "too_many_concurrent_streams"
        assert "Retry-After" in info.value.response.headers
        assert ask(client, "not streamed: not counted").choices  # only streams count
        other = ask(sdk(proxy, "sk-streams-2"), "another tenant [[len:2]]", stream=True)
        assert [c for c in other]
        assert [c for c in stream]  # the first stream finishes
        assert [c for c in ask(client, "free again [[len:2]]", stream=True)]

        too_many = [{"role": "user", "content": str(i)} for i in range(4)]
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=too_many)
        assert info.value.status_code == 400 and info.value.param == "messages"
    finally:
        proxy.stop()


def test_two_replicas_share_the_rate_and_stream_limits_in_redis(emulator, tmp_path, redis_url):
    env = {"MEMCI_MANAGE_CONTEXT": "false", "REDIS_URL": redis_url, "MEMCI_RATE_LIMIT_RPS": "0.01",
           "MEMCI_RATE_LIMIT_BURST": "3", "MEMCI_MAX_CONCURRENT_STREAMS_PER_TENANT": "1"}
    one = ProxyProcess(emulator.base_url, tmp_path / "one", env).start()
    two = ProxyProcess(emulator.base_url, tmp_path / "two", env).start()
    try:
        a, b = sdk(one, "sk-shared"), sdk(two, "sk-shared")
        stream = ask(a, "a slow stream [[slow:0.2]] [[len:6]]", stream=True)
        next(iter(stream))
        with pytest.raises(openai.RateLimitError) as info:
            ask(b, "a second stream on the other replica", stream=True)
        assert info.value.code == "too_many_concurrent_streams"
        assert [c for c in stream]
        ask(b, "third request of the tenant, on the other replica")
        with pytest.raises(openai.RateLimitError) as info:
            ask(a, "fourth: the shared bucket is empty")
        assert info.value.code == "rate_limit_exceeded" and int(info.value.response.headers["Retry-After"]) > 60
        assert "memci_limit_backend_errors_total 0.0" in httpx.get(one.url + "/metrics").text
    finally:
        one.stop()
        two.stop()
