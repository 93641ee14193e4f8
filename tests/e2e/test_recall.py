"""The recall tool end to end: openai SDK -> proxy -> emulator scripted to call `recall`."""

from __future__ import annotations

import json

import openai
import pytest


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
FACT = "My locker code is 7349 and my cat is called Brioche."


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    # the model's own recall calls: the proxy's push (tests/e2e/test_push.py) would answer these questions first
    return emulator_and_proxy(4096, env={"MEMCI_MEMORY_PUSH": "off"})


def ask(client, messages, text, **kw):
    messages.append({"role": "user", "content": text})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=200, **kw)
    r = raw.parse()
    message = r.choices[0].message.model_dump(exclude_none=True)
    messages.append(message)
    return raw.headers, r


@pytest.fixture(scope="module")
def long_conversation(proxy):
    """100 turns; the fact appears only in turn 3 (page 3), long since archived."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-recall", max_retries=0, timeout=30)
    messages: list[dict] = []
    for turn in range(1, 101):
        text = FACT if turn == 3 else f"Chit-chat number {turn} about the weather and the news."
        headers, _ = ask(client, messages, text + " [[len:80]]")
    assert int(headers["x-memci-pages-archived"]) > 50
    yield client, messages
    client.close()


def test_recall_by_page(long_conversation, emu):
    client, history = long_conversation
    messages = list(history)
    headers, r = ask(client, messages, 'What was my locker code? [[call:recall {"pages": [3]}]]')
    answer = r.choices[0].message
    assert answer.tool_calls is None
    assert r.choices[0].finish_reason == "stop"
    assert "7349" in answer.content
    sent = emu.requests(2)
    assert any(t["function"]["name"] == "recall" for t in sent[0]["body"]["tools"])
    last = sent[-1]["body"]["messages"]
    assert last[-1]["role"] == "tool" and "[Page 3]" in last[-1]["content"]
    assert r.usage.prompt_tokens == sent[0]["prompt_tokens"] + sent[1]["prompt_tokens"]


def test_recall_by_query_streaming(long_conversation):
    client, history = long_conversation
    messages = list(history)
    messages.append({"role": "user", "content": 'Name of my cat? [[call:recall {"query": "cat called"}]]'})
    chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True, max_tokens=200,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Brioche" in text and "Page 3" in text
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].usage.prompt_tokens > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]


def test_the_next_turn_keeps_the_recall_exchange_and_the_cache(long_conversation, emu):
    client, history = long_conversation
    messages = list(history)
    headers, r = ask(client, messages, 'Locker? [[call:recall {"pages": [3]}]]')
    headers, r2 = ask(client, messages, "Thanks! [[len:10]]")
    if headers["x-memci-epoch"] == "false":
        sent = emu.turn_requests(1)[0]["body"]["messages"]
        roles = [m["role"] for m in sent[-5:]]
        assert roles == ["user", "assistant", "tool", "assistant", "user"]
        assert sent[-4]["tool_calls"][0]["function"]["name"] == "recall"
        assert r2.usage.prompt_tokens_details.cached_tokens >= 0.9 * r2.usage.prompt_tokens


def test_mixed_recall_and_client_tool_round_trip(long_conversation, emu):
    client, history = long_conversation
    messages = list(history)
    headers, r = ask(client, messages,
                     'Weather and my code? [[call:recall {"pages": [3]}]] [[call:get_weather {"city": "Paris"}]]',
                     tools=[WEATHER])
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"]
    assert r.choices[0].finish_reason == "tool_calls"
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "rainy, 12C"})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=[WEATHER], max_tokens=50)
    final = raw.parse()
    assert "rainy, 12C" in final.choices[0].message.content
    sent = emu.turn_requests(1)[0]["body"]["messages"]
    tail = sent[-5:]
    assert [m["role"] for m in tail] == ["user", "assistant", "tool", "assistant", "tool"]
    assert tail[1]["tool_calls"][0]["function"]["name"] == "recall"
    assert tail[2]["tool_call_id"] == tail[1]["tool_calls"][0]["id"]
    assert tail[3]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_mixed_streaming_renumbers_client_calls(long_conversation):
    client, history = long_conversation
    messages = list(history)
    messages.append({"role": "user", "content":
                     '[[call:recall {"query": "locker"}]] [[call:get_weather {"city": "Rome"}]]'})
    stream = client.chat.completions.create(model="m", messages=messages, tools=[WEATHER], stream=True, max_tokens=200)
    calls: dict[int, dict] = {}
    for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            entry = calls.setdefault(tc.index, {"name": "", "args": ""})
            entry["name"] += (tc.function.name or "") if tc.function else ""
            entry["args"] += (tc.function.arguments or "") if tc.function else ""
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["args"]) == {"city": "Rome"}


def test_unknown_page_gets_a_clear_message(long_conversation, emu):
    client, history = long_conversation
    messages = list(history)
    ask(client, messages, '[[call:recall {"pages": [9999]}]]')
    tool = emu.turn_requests(1)[0]["body"]["messages"][-1]
    assert tool["role"] == "tool" and "does not exist" in tool["content"]


def test_tool_choice_none_is_respected(long_conversation, emu):
    client, history = long_conversation
    messages = list(history)
    headers, r = ask(client, messages, '[[call:recall {"pages": [3]}]] [[len:5]]', tool_choice="none")
    assert r.choices[0].message.tool_calls is None
    assert emu.turn_requests(1)[0]["body"]["tool_choice"] == "none"


def test_n_2_with_recall(long_conversation):
    client, history = long_conversation
    messages = list(history)
    messages.append({"role": "user", "content": 'Code? [[call:recall {"pages": [3]}]]'})
    r = client.chat.completions.create(model="m", messages=messages, n=2, max_tokens=200)
    assert len(r.choices) == 2
    for choice in r.choices:
        assert choice.message.tool_calls is None
        assert "7349" in choice.message.content


def test_search_api_is_scoped_by_tenant(long_conversation, proxy):
    import httpx

    client, history = long_conversation
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[*history, {"role": "user", "content": "ok [[len:3]]"}], max_tokens=20)
    conversation = raw.headers["x-memci-conversation-id"]
    body = {"conversation_id": conversation, "query": "locker code", "k": 3}
    mine = httpx.post(proxy.url + "/memci/search", json=body, headers={"Authorization": "Bearer sk-recall"}, timeout=10)
    assert mine.status_code == 200
    hits = mine.json()["hits"]
    assert hits and hits[0]["page"] == "3" and "7349" in hits[0]["excerpt"]
    theirs = httpx.post(proxy.url + "/memci/search", json=body, headers={"Authorization": "Bearer sk-other"}, timeout=10)
    assert theirs.status_code == 404
    bad = httpx.post(proxy.url + "/memci/search", json={"query": "x"}, headers={"Authorization": "Bearer sk-recall"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "conversation_id"
