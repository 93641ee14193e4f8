"""Upstream failures through a managed proxy (embedded PostgreSQL, in-process hot state): the client always gets
the upstream's status and body, or an OpenAI-style error, never a hang; a client that leaves cancels the upstream."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.resilience.conftest import Chat, assert_openai_error, metric_value


@pytest.fixture(scope="module")
def proxy(emulator_8k, tmp_path_factory):
    from tests.e2e.proxyproc import ProxyProcess

    env = {"MEMCI_UPSTREAM_READ_TIMEOUT": "3"}
    p = ProxyProcess(emulator_8k.base_url, tmp_path_factory.mktemp("faults"), env).start()
    yield p
    p.stop()


def stream_events(client: httpx.Client, url: str, body: dict, headers: dict, timeout: float = 30.0):
    with client.stream("POST", url, json=body, headers=headers, timeout=timeout) as r:
        if r.status_code != 200:
            r.read()
            return r, []
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        return r, events


@pytest.mark.parametrize("code", [500, 429, 503])
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_status_is_passed_through(proxy, code, stream):
    chat = Chat(proxy.url, f"status{code}x{stream}")
    with httpx.Client() as client:
        assert chat.send(client, chat.user_text(0)).status_code == 200  # a managed conversation first
        body = chat.body(chat.user_text(1, f"[[status:{code}]]"), stream=stream)
        r = client.post(proxy.base_url + "/chat/completions", json=body, headers=chat.headers(), timeout=30)
        assert r.status_code == code
        assert_openai_error(r)
        assert r.json()["error"]["code"] == "injected_fault"
        # The conversation goes on.
        assert chat.send(client, chat.user_text(2)).status_code == 200


@pytest.mark.parametrize("marker", ["[[cut:3]]", "[[abort:3]]", "[[badsse]]"])
def test_broken_streams_end_with_an_error_event_or_a_valid_stream(proxy, marker):
    chat = Chat(proxy.url, f"broken{marker[2:-2]}")
    with httpx.Client() as client:
        r, events = stream_events(client, proxy.base_url + "/chat/completions",
                                  chat.body(chat.user_text(0, marker), stream=True), chat.headers())
        assert r.status_code == 200
        assert events and events[-1] == "[DONE]", events[-3:]
        if marker != "[[badsse]]":
            last = json.loads(events[-2])
            assert last["error"]["code"] == "upstream_cut", last
        assert chat.send(client, chat.user_text(1)).status_code == 200


def test_badsse_without_streaming_is_an_error_or_the_body(proxy):
    chat = Chat(proxy.url, "badjson")
    with httpx.Client() as client:
        r = chat.send(client, chat.user_text(0, "[[badsse]]"))
        assert r.status_code in (200, 502), r.text
        if r.status_code != 200:
            assert_openai_error(r)


def test_slow_bytes_time_out_with_an_error_not_a_hang(proxy):
    chat = Chat(proxy.url, "slow")
    started = time.monotonic()
    with httpx.Client() as client:
        r, events = stream_events(client, proxy.base_url + "/chat/completions",
                                  chat.body(chat.user_text(0, "[[slow:6]] [[len:5]]"), stream=True), chat.headers())
        assert time.monotonic() - started < 25
        assert r.status_code == 200
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "upstream_cut"
        r = chat.send(client, chat.user_text(1, "[[delay:6]]"))
        assert r.status_code == 504
        assert_openai_error(r)


def test_client_disconnect_cancels_the_upstream_request(proxy, emulator_8k):
    chat = Chat(proxy.url, "leaver")
    before = metric_value(proxy.url, "memci_client_disconnects_total")
    with httpx.Client() as client:
        with client.stream("POST", proxy.base_url + "/chat/completions", headers=chat.headers(), timeout=30,
                           json=chat.body(chat.user_text(0, "[[slow:0.3]] [[len:60]]"), stream=True)) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
        # closed after three lines
    deadline = time.monotonic() + 10
    while metric_value(proxy.url, "memci_client_disconnects_total") <= before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric_value(proxy.url, "memci_client_disconnects_total") > before
    # The emulator stops working on it: no running request left.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running = httpx.get(emulator_8k.url + "/metrics", timeout=5).text
        if any(line.startswith("sglang:num_running_reqs") and line.rstrip().endswith(" 0.0") for line in running.splitlines()):
            break
        time.sleep(0.1)
    else:
        pytest.fail("the upstream request kept running after the client left")
    # The lock was released: the next turn of the same conversation goes through at once.
    with httpx.Client() as client:
        assert chat.send(client, chat.user_text(1), timeout=10).status_code == 200
