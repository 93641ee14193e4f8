"""Anthropic's Messages API, managed, end to end: the official anthropic SDK -> proxy -> emulator (which the proxy
speaks chat completions to). A long conversation archives pages and gets one back by recall."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.e2e.recall_client import metric_sample

FACT = "My locker code is 7349 and my cat is called Brioche."
WEATHER = {"name": "get_weather", "description": "The weather of a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
SYSTEM = [{"type": "text", "text": "You are a helpful assistant.", "cache_control": {"type": "ephemeral"}}]


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096)


@pytest.fixture(scope="module")
def client(proxy):
    c = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant-test", max_retries=0, timeout=60)
    yield c
    c.close()


def _as_param(message) -> dict:
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}


@pytest.fixture(scope="module")
def long_conversation(client):
    """60 turns, the fact in turn 3; every turn resends the whole conversation, as Anthropic's API wants."""
    messages: list[dict] = []
    raw = None
    for turn in range(1, 61):
        text = FACT if turn == 3 else f"Chit-chat number {turn} about the weather and the news."
        messages.append({"role": "user", "content": [{"type": "text", "text": text + " [[len:80]]"}]})
        raw = client.messages.with_raw_response.create(model="m", max_tokens=200, system=SYSTEM, messages=messages)
        messages.append(_as_param(raw.parse()))
    assert int(raw.headers["x-memci-pages-archived"]) > 20
    assert raw.parse().usage.cache_read_input_tokens > 0
    return messages


def test_a_conversation_keeps_its_cache(client, emu):
    messages: list[dict] = []
    for turn in range(1, 4):
        messages.append({"role": "user", "content": f"Hello number {turn} [[len:12]]"})
        m = client.messages.create(model="m", max_tokens=100, system="Be brief.", messages=messages)
        assert m.type == "message" and m.role == "assistant" and m.stop_reason == "end_turn"
        assert m.content[0].type == "text" and m.content[0].text
        messages.append(_as_param(m))
    assert m.usage.cache_read_input_tokens > 0 and m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    sent = emu.turn_requests(1)[0]["body"]
    assert sent["messages"][0]["role"] == "system" and sent["messages"][0]["content"].startswith("Be brief.")
    assert "recall" in [t["function"]["name"] for t in sent["tools"]]


def test_tool_use_round_trip(client, emu):
    messages = [{"role": "user", "content": 'Weather in Paris? [[call:get_weather {"city": "Paris"}]]'}]
    m = client.messages.create(model="m", max_tokens=100, tools=[WEATHER], messages=messages)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].input == {"city": "Paris"}
    messages += [_as_param(m), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": uses[0].id, "content": "Sunny, 21 C"},
        {"type": "text", "text": "Thanks!"}]}]
    follow = client.messages.create(model="m", max_tokens=100, tools=[WEATHER], messages=messages)
    assert follow.stop_reason == "end_turn"
    sent = emu.turn_requests(1)[0]["body"]["messages"]
    assert sent[-2] == {"role": "tool", "tool_call_id": uses[0].id, "content": "Sunny, 21 C"}
    assert sent[-1] == {"role": "user", "content": "Thanks!"}


def test_streamed_with_the_sdk_helpers(client):
    with client.messages.stream(model="m", max_tokens=100, messages=[
            {"role": "user", "content": "Tell me a story [[len:30]]"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_streamed_tool_use(client):
    with client.messages.stream(model="m", max_tokens=100, tools=[WEATHER], messages=[
            {"role": "user", "content": 'Weather in Oslo? [[call:get_weather {"city": "Oslo"}]]'}]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and "content_block_start" in kinds and kinds[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    assert [(b.type, b.input) for b in final.content if b.type == "tool_use"] == [("tool_use", {"city": "Oslo"})]


def test_recall(client, long_conversation, emu):
    messages = [*long_conversation, {"role": "user", "content": 'What was my locker code? [[call:recall {"pages": [3]}]]'}]
    m = client.messages.create(model="m", max_tokens=200, system=SYSTEM, messages=messages)
    assert "7349" in m.content[0].text
    assert all(b.type != "tool_use" for b in m.content)  # the proxy answered recall itself
    last = emu.turn_requests(1)[0]["body"]["messages"]
    assert last[-1]["role"] == "tool" and "[Page 3]" in last[-1]["content"]


def test_recall_streamed(client, long_conversation):
    messages = [*long_conversation, {"role": "user", "content": 'Name of my cat? [[call:recall {"query": "cat called"}]]'}]
    with client.messages.stream(model="m", max_tokens=200, system=SYSTEM, messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert "Brioche" in text
    assert [b.type for b in final.content] == ["text"]


def test_count_tokens_counts_the_prompt_the_proxy_would_send(client, long_conversation, emu):
    short = client.messages.count_tokens(model="m", messages=[{"role": "user", "content": "hi"}])
    long = client.messages.count_tokens(model="m", system=SYSTEM, messages=long_conversation)
    assert 0 < short.input_tokens < 2000  # (the recall tool the proxy adds is most of it)
    # 60 answers of 80 words (over 4,800 tokens) in the client's history; the prompt sent is the window's part
    sent = [r for r in emu.requests(200) if r["body"]["messages"][0]["content"].startswith("You are a helpful")]
    assert sent and 0.7 * sent[-1]["prompt_tokens"] < long.input_tokens < 4096
    assert long.input_tokens > short.input_tokens
    # the tools are counted (a new tool in a long conversation changes its cached prefix: the plan may then compact,
    # so the tools' cost is checked on a short one)
    short_tools = client.messages.count_tokens(model="m", tools=[WEATHER], messages=[{"role": "user", "content": "hi"}])
    assert short_tools.input_tokens > short.input_tokens
    with_tools = client.messages.count_tokens(model="m", system=SYSTEM, tools=[WEATHER], messages=long_conversation)
    assert 0 < with_tools.input_tokens < 4096


def test_errors_in_anthropic_shape(client, proxy):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=10, messages=[
            {"role": "user", "content": [{"type": "search_result", "source": "x"}]}])
    assert bad.value.body["type"] == "error" and bad.value.body["error"]["type"] == "invalid_request_error"
    r = httpx.post(proxy.url + "/v1/messages", json={"model": "m", "messages": []},
                   headers={"x-api-key": "k"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens")


def test_auth_by_x_api_key_names_the_same_tenant(proxy):
    """The same key by x-api-key or as a bearer token: one tenant, so one conversation."""
    body = {"model": "m", "max_tokens": 20, "messages": [{"role": "user", "content": "Same tenant? [[len:3]]"}]}
    a = httpx.post(proxy.url + "/v1/messages", json=body, headers={"x-api-key": "sk-same"}, timeout=10)
    b = httpx.post(proxy.url + "/v1/messages", json=body, headers={"Authorization": "Bearer sk-same"}, timeout=10)
    assert a.status_code == b.status_code == 200
    assert a.headers["x-memci-conversation-id"] == b.headers["x-memci-conversation-id"]


def test_metrics_by_api(client, proxy):
    client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "Count me [[len:3]]"}])

    def sample(name: str, labels: str) -> float:
        return metric_sample(proxy, name, labels)

    assert sample("memci_api_requests_total", 'api="messages",status="200"') >= 1
    assert sample("memci_api_requests_total", 'api="messages",status="400"') >= 1
    assert sample("memci_api_cached_tokens_total", 'api="messages"') > 0
    assert sample("memci_api_requests_total", 'api="responses",status="200"') == 0
