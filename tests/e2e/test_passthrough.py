"""The transparent proxy through the official openai SDK (context management off)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_chat_non_streaming(passthrough_proxy, client_for, emulator):
    client = client_for(passthrough_proxy)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[say:hello there]]"}])
    assert r.choices[0].message.content == "hello there"
    assert r.usage.prompt_tokens > 0
    sent = emulator.turn_requests(1)[0]
    body = sent.get("body", sent)
    assert body["messages"] == [{"role": "user", "content": "[[say:hello there]]"}]


def test_unknown_fields_and_headers_reach_upstream(passthrough_proxy, emulator):
    r = httpx.post(
        passthrough_proxy.base_url + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "x_vendor_field": {"a": [1, 2]}},
        headers={"Authorization": "Bearer sk-abc", "X-Request-Id": "req-42"},
        timeout=10,
    )
    assert r.status_code == 200
    sent = emulator.turn_requests(1)[0]
    body = sent.get("body", sent)
    assert body["x_vendor_field"] == {"a": [1, 2]}


def test_streaming_with_usage(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "tell me [[len:40]]"}], stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) > 20
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    assert len({c.id for c in chunks}) == 1


def test_streaming_without_usage(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_streaming_relays_events_as_they_come(passthrough_proxy):
    """With the upstream pausing between chunks, the first event reaches the client long before the last."""
    started = time.perf_counter()
    arrivals = []
    with httpx.stream(
        "POST", passthrough_proxy.base_url + "/chat/completions", timeout=30,
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "x [[slow:0.2]] [[len:10]]"}]},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                arrivals.append(time.perf_counter() - started)
    assert len(arrivals) >= 4
    assert arrivals[-1] - arrivals[0] >= 0.4


def test_n_2(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "two please"}], n=2)
    assert sorted(c.index for c in r.choices) == [0, 1]


def test_client_tool_call_round_trip(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    messages = [{"role": "user", "content": 'weather? [[call:get_weather {"city": "Paris"}]]'}]
    r = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"})
    r2 = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
    assert "sunny, 21C" in r2.choices[0].message.content


def test_streamed_tool_call_deltas(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": '[[call:get_weather {"city": "Oslo"}]]'}], tools=[WEATHER],
        stream=True,
    )
    calls: dict[int, dict] = {}
    for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(tc.index, {"name": "", "args": ""})
            if tc.function and tc.function.name:
                entry["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                entry["args"] += tc.function.arguments
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["args"]) == {"city": "Oslo"}


def test_models_and_other_paths_are_forwarded(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    models = client.models.list()
    assert models.data and models.data[0].id
    emb = client.embeddings.create(model="m", input=["a b c"])
    assert len(emb.data[0].embedding) > 0


@pytest.mark.parametrize(
    "payload, status, param",
    [
        (b"{not json", 400, None),
        (b'{"model": "m"}', 400, "messages"),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', 400, "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}', 400, "stream_options"),
    ],
)
def test_bad_requests_get_openai_errors(passthrough_proxy, payload, status, param):
    r = httpx.post(passthrough_proxy.base_url + "/chat/completions", content=payload,
                   headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param:
        assert err["param"] == param


def test_sdk_raises_bad_request(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])


def test_upstream_status_and_body_pass_through(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[status:429]]"}])
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "[[status:500]]"}])
    assert err.value.status_code == 500


def test_upstream_cut_stream_is_an_error_not_a_short_answer(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "[[cut:3]] [[len:50]]"}], stream=True))


def test_client_disconnect_cancels_upstream(passthrough_proxy):
    with httpx.stream(
        "POST", passthrough_proxy.base_url + "/chat/completions", timeout=30,
        json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "[[slow:0.3]] [[len:60]]"}]},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # leave after the first event
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        text = httpx.get(passthrough_proxy.url + "/metrics").text
        if "memci_client_disconnects_total 1.0" in text or "memci_client_disconnects_total 2.0" in text:
            break
        time.sleep(0.1)
    assert "memci_inflight_streams 0.0" in text
    assert "memci_client_disconnects_total 0.0" not in text


def test_body_too_large_is_413(emulator, tmp_path):
    from tests.e2e.proxyproc import running_proxy

    with running_proxy(emulator.base_url, tmp_path, {"MEMCI_MANAGE_CONTEXT": "false", "MEMCI_MAX_BODY_BYTES": "1000"}) as p:
        r = httpx.post(p.base_url + "/chat/completions", timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "body_too_large"


def test_upstream_unreachable_is_502(tmp_path):
    from tests.e2e.proxyproc import free_port, running_proxy

    with running_proxy(f"http://127.0.0.1:{free_port()}/v1", tmp_path, {"MEMCI_MANAGE_CONTEXT": "false"}) as p:
        r = httpx.post(p.base_url + "/chat/completions", timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_unreachable"


def test_upstream_timeout_is_504(emulator, tmp_path):
    from tests.e2e.proxyproc import running_proxy

    with running_proxy(emulator.base_url, tmp_path, {"MEMCI_MANAGE_CONTEXT": "false", "MEMCI_UPSTREAM_READ_TIMEOUT": "0.3"}) as p:
        r = httpx.post(p.base_url + "/chat/completions", timeout=10,
                       json={"model": "m", "messages": [{"role": "user", "content": "[[delay:2]]"}]})
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "upstream_timeout"


def test_metrics_move(passthrough_proxy, client_for):
    client = client_for(passthrough_proxy)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "count me"}])
    text = httpx.get(passthrough_proxy.url + "/metrics").text
    for name in ("memci_requests_total", "memci_request_duration_seconds_bucket", "memci_upstream_ttft_seconds_bucket",
                 "memci_proxy_overhead_seconds_bucket", "memci_upstream_prompt_tokens_total", "memci_inflight_streams"):
        assert name in text
    assert 'memci_requests_total{route="chat",status="200"}' in text
