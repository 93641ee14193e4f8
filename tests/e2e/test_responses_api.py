"""The Responses API, managed, end to end: the official openai SDK's client.responses -> proxy -> emulator (which
the proxy speaks chat completions to). A long conversation archives pages and gets one back by recall."""

from __future__ import annotations

import json

import openai
import pytest

from tests.e2e.recall_client import metric_sample

FACT = "My locker code is 7349 and my cat is called Brioche."
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather of a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096)


@pytest.fixture(scope="module")
def client(proxy):
    c = openai.OpenAI(base_url=proxy.base_url, api_key="sk-responses", max_retries=0, timeout=60)
    yield c
    c.close()


@pytest.fixture(scope="module")
def long_chain(client):
    """60 turns chained by previous_response_id only (the client never resends a turn); the fact in turn 3."""
    previous = None
    raw = None
    for turn in range(1, 61):
        text = FACT if turn == 3 else f"Chit-chat number {turn} about the weather and the news."
        raw = client.responses.with_raw_response.create(
            model="m", input=text + " [[len:80]]", max_output_tokens=200, previous_response_id=previous,
            instructions="You are a helpful assistant.")
        previous = raw.parse().id
    assert int(raw.headers["x-memci-pages-archived"]) > 20
    return previous


def test_a_stateless_conversation_resends_its_input(client, emu):
    items: list = []
    for turn in range(1, 4):
        items.append({"role": "user", "content": f"Hello number {turn} [[len:12]]"})
        r = client.responses.create(model="m", input=items, instructions="Be brief.")
        assert r.status == "completed" and r.object == "response" and r.id.startswith("resp_")
        assert r.output_text and r.output[0].type == "message"
        items += [item.model_dump(exclude_none=True) for item in r.output]
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.input_tokens_details.cached_tokens > 0  # the conversation's prefix stayed cached upstream
    sent = emu.turn_requests(1)[0]["body"]
    assert sent["messages"][0] == {"role": "system", "content": "Be brief."} or \
        sent["messages"][0]["content"].startswith("Be brief.")
    assert [m["role"] for m in sent["messages"][1:6]] == ["user", "assistant", "user", "assistant", "user"]
    assert "recall" in [t["function"]["name"] for t in sent["tools"]]


def test_a_function_tool_round_trip(client, emu):
    r = client.responses.create(model="m", input='Weather in Paris? [[call:get_weather {"city": "Paris"}]]',
                                tools=[WEATHER])
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert all(o.type != "function_call" or o.name != "recall" for o in r.output)
    follow = client.responses.create(model="m", previous_response_id=r.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 C"}])
    assert follow.status == "completed" and follow.output_text
    sent = emu.turn_requests(1)[0]["body"]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "Sunny, 21 C"}
    assert sent[-2]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_streamed_with_the_sdk_helpers(client):
    with client.responses.stream(model="m", input="Tell me a story [[len:30]]") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert len(deltas) > 3 and "".join(deltas) == final.output_text
    assert final.status == "completed" and final.usage.output_tokens > 0
    assert final.usage.input_tokens_details.cached_tokens >= 0


def test_streamed_function_call(client):
    events = list(client.responses.create(
        model="m", input='Weather in Oslo? [[call:get_weather {"city": "Oslo"}]]', tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds and "response.function_call_arguments.delta" in kinds
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(arguments) == {"city": "Oslo"}
    done = events[-1].response
    assert [o.type for o in done.output if o.type == "function_call"] == ["function_call"]
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_recall_through_previous_response_id(client, long_chain, emu):
    r = client.responses.create(model="m", previous_response_id=long_chain, max_output_tokens=200,
                                input='What was my locker code? [[call:recall {"pages": [3]}]]')
    assert "7349" in r.output_text
    assert all(o.type != "function_call" for o in r.output)  # the proxy answered recall itself
    last = emu.turn_requests(1)[0]["body"]["messages"]
    assert last[-1]["role"] == "tool" and "[Page 3]" in last[-1]["content"]


def test_recall_streamed(client, long_chain):
    events = list(client.responses.create(model="m", previous_response_id=long_chain, stream=True,
                                          input='Name of my cat? [[call:recall {"query": "cat called"}]]'))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "Brioche" in text
    assert not any(e.type == "response.function_call_arguments.delta" for e in events)
    assert events[-1].type == "response.completed" and events[-1].response.output_text == text


def test_errors_in_the_responses_shape(client, proxy):
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="m", input="hi", previous_response_id="resp_nope")
    assert missing.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="m", input=[{"type": "web_search_call", "id": "x"}])
    assert bad.value.body["param"] == "input[0].type"


def test_unknown_fields_pass_through(client, emu):
    client.responses.create(model="m", input="hi [[len:3]]", extra_body={"top_k": 7, "seed": 3}, temperature=0.5)
    body = emu.turn_requests(1)[0]["body"]
    assert body["top_k"] == 7 and body["seed"] == 3 and body["temperature"] == 0.5


def test_metrics_by_api(client, proxy):
    client.responses.create(model="m", input="Count me [[len:3]]")

    def sample(name: str, labels: str) -> float:
        return metric_sample(proxy, name, labels)

    assert sample("memci_api_requests_total", 'api="responses",status="200"') >= 1
    assert sample("memci_api_requests_total", 'api="responses",status="404"') >= 1  # previous_response_not_found
    assert sample("memci_api_cached_tokens_total", 'api="responses"') > 0
    assert sample("memci_api_prompt_tokens_total", 'api="responses"') > sample("memci_api_cached_tokens_total",
                                                                              'api="responses"')
    assert sample("memci_api_request_duration_seconds_count", 'api="responses"') >= 1


def test_a_streamed_answer_is_chained_too(client, emu):
    events = list(client.responses.create(model="m", input="Remember the word pineapple [[len:5]]", stream=True))
    first = events[-1].response
    follow = client.responses.create(model="m", previous_response_id=first.id, input="And now? [[len:5]]")
    assert follow.status == "completed"
    sent = emu.turn_requests(1)[0]["body"]["messages"]
    assert sent[-3]["content"] == "Remember the word pineapple [[len:5]]"
    assert sent[-2] == {"role": "assistant", "content": first.output_text}
    assert follow.usage.input_tokens_details.cached_tokens > 0
