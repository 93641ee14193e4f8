"""The emulator served in a subprocess, driven with the official openai SDK and raw HTTP."""

import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.emulator.testing import running_emulator

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with running_emulator(EmulatorConfig(model="emu-test", max_model_len=4096)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30) as sdk_client:
        yield sdk_client


@pytest.fixture
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url.removesuffix("/v1"), timeout=30) as raw_client:
        yield raw_client


def test_non_streaming_completion(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "Hello [[len:20]]"}])
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion"
    assert reply.model == "emu-test" and reply.system_fingerprint and reply.created > 0
    choice = reply.choices[0]
    assert choice.finish_reason == "stop" and choice.message.role == "assistant" and choice.message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 21
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 21
    assert reply.usage.prompt_tokens_details is not None and reply.usage.prompt_tokens_details.cached_tokens >= 0


def test_streaming_with_usage_matches_the_non_streaming_answer(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Stream me something"}]
    whole = client.chat.completions.create(model="emu-test", messages=messages)
    stream = client.chat.completions.create(
        model="emu-test", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == whole.choices[0].message.content
    content_chunks = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]
    assert len(content_chunks) > 5
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_tool_call_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="emu-test",
        messages=[{"role": "user", "content": 'Weather? [[call:get_weather {"city": "Paris"}]] [[call:get_time]]'}],
        tools=TOOLS,  # type: ignore[arg-type]
        stream=True,
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                entry["id"] = delta.id
            if delta.function and delta.function.name:
                entry["name"] = delta.function.name
            if delta.function and delta.function.arguments:
                entry["arguments"] += delta.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [calls[i]["name"] for i in sorted(calls)] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"} and json.loads(calls[1]["arguments"]) == {}
    assert all(call["id"].startswith("call_") for call in calls.values())


def test_tool_choice_none_answers_text(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="emu-test",
        messages=[{"role": "user", "content": "[[call:get_time]]"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
    )
    assert reply.choices[0].finish_reason == "stop" and not reply.choices[0].message.tool_calls


def test_n_choices(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "two please"}], n=2)
    assert [choice.index for choice in reply.choices] == [0, 1]
    assert reply.choices[0].message.content != reply.choices[1].message.content
    streamed: dict[int, str] = {0: "", 1: ""}
    for chunk in client.chat.completions.create(
        model="emu-test", messages=[{"role": "user", "content": "two please"}], n=2, stream=True
    ):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
    assert streamed == {0: reply.choices[0].message.content, 1: reply.choices[1].message.content}


def test_cached_tokens_grow_across_turns_of_a_conversation(client: openai.OpenAI, http: httpx.Client) -> None:
    http.post("/emulator/reset").raise_for_status()
    messages: list[Any] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Turn one, with tools"},
    ]
    previous_total = None
    cached_seen = []
    for turn in range(4):
        reply = client.chat.completions.create(model="emu-test", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        usage = reply.usage
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        if previous_total is not None:
            assert cached == previous_total
        cached_seen.append(cached)
        previous_total = usage.prompt_tokens + usage.completion_tokens
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        messages.append({"role": "user", "content": f"Turn {turn + 2}"})
    assert cached_seen[0] == 0 and cached_seen == sorted(cached_seen) and cached_seen[-1] > 0
    logged = http.get("/emulator/requests", params={"n": 2}).json()["data"]
    assert [entry["cached_tokens"] for entry in logged] == cached_seen[-2:]
    assert logged[-1]["body"]["messages"][-1]["content"] == "Turn 4"
    stats = http.get("/emulator/stats").json()
    assert stats["requests"] == 4 and stats["cached_tokens"] == sum(cached_seen)


def test_injected_status_faults(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as server_error:
        client.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "[[status:503]]"}])
    assert server_error.value.status_code == 503
    assert isinstance(server_error.value.body, dict) and server_error.value.body["type"] == "server_error"
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "[[status:429]]"}])


def test_delay_before_first_byte_trips_a_short_client_timeout(base_url: str) -> None:
    with openai.OpenAI(base_url=base_url, api_key="x", max_retries=0, timeout=0.3) as impatient:
        with pytest.raises(openai.APITimeoutError):
            impatient.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "[[delay:2]]"}])


def stream_body(http: httpx.Client, content: str) -> str:
    response = http.post(
        "/v1/chat/completions", json={"model": "emu-test", "messages": [{"role": "user", "content": content}], "stream": True}
    )
    assert response.status_code == 200
    return response.text


def test_cut_stream_ends_without_done(http: httpx.Client) -> None:
    body = stream_body(http, "[[cut:3]] [[len:40]]")
    assert body.count("data: ") == 3 and "[DONE]" not in body


def test_badsse_emits_a_malformed_event(http: httpx.Client, client: openai.OpenAI) -> None:
    events = [line[6:] for line in stream_body(http, "[[badsse]]").split("\n\n") if line.startswith("data: ")]
    undecodable = 0
    for data in events:
        if data == "[DONE]":
            continue
        try:
            json.loads(data)
        except ValueError:
            undecodable += 1
    assert undecodable == 1 and events[-1] == "[DONE]"
    with pytest.raises(Exception):
        list(client.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "[[badsse]]"}], stream=True))


def test_abort_drops_the_connection(http: httpx.Client) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        stream_body(http, "[[abort:2]] [[len:40]]")


def test_malformed_requests_get_openai_error_bodies(http: httpx.Client, client: openai.OpenAI) -> None:
    response = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="emu-test", messages=[])
    assert http.get("/v1/nowhere").status_code == 404


def test_context_length_exceeded(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "word " * 5000}])
    assert raised.value.code == "context_length_exceeded"


def test_models_embeddings_and_completions(client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [model.id for model in models] == ["emu-test"]
    assert models[0].owned_by == "memci-emulator" and models[0].model_dump()["max_model_len"] == 4096
    embedded = client.embeddings.create(model="emu-test", input=["red fox", "blue whale"])
    assert len(embedded.data) == 2 and len(embedded.data[0].embedding) == 64
    assert math.isclose(sum(value * value for value in embedded.data[0].embedding), 1.0, rel_tol=1e-5)
    completion = client.completions.create(model="emu-test", prompt="Once upon a time [[len:8]]", max_tokens=50)
    assert completion.choices[0].text and completion.usage is not None and completion.usage.completion_tokens == 9


def test_health_metrics_and_reset(http: httpx.Client, client: openai.OpenAI) -> None:
    assert http.get("/health").status_code == 200
    client.chat.completions.create(model="emu-test", messages=[{"role": "user", "content": "count me"}])
    metrics = http.get("/metrics").text
    for name in (
        "sglang:prompt_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:cache_hit_rate",
    ):
        assert f"\n{name}{{" in "\n" + metrics
    assert http.post("/emulator/reset").status_code == 200
    stats = http.get("/emulator/stats").json()
    assert stats["requests"] == 0 and stats["cache_tokens"] == 0
    assert http.get("/emulator/requests").json()["data"] == []


def test_configuration_reaches_the_subprocess_and_small_caches_evict() -> None:
    config = EmulatorConfig(
        model="tiny",
        cache_capacity_tokens=300,
        per_uncached_token_s=0.0001,
        per_cached_token_s=0.00001,
        per_output_token_s=0.0005,
        embedding_dim=16,
        default_answer_tokens=12,
    )
    with running_emulator(config) as url:
        with openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30) as sdk_client:
            for index in range(6):
                stream = sdk_client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"conversation {index} " + "filler " * 40}],
                    stream=True,
                    stream_options={"include_usage": True},
                )
                usage = list(stream)[-1].usage
                assert usage is not None and usage.completion_tokens == 13
            assert len(sdk_client.embeddings.create(model="tiny", input="x").data[0].embedding) == 16
        with httpx.Client(base_url=url.removesuffix("/v1")) as raw_client:
            stats = raw_client.get("/emulator/stats").json()
    assert stats["config"]["cache_capacity_tokens"] == 300 and stats["config"]["per_output_token_s"] == 0.0005
    assert stats["cache_tokens"] <= 300 and stats["evicted_tokens"] > 0
