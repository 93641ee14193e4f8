"""Pass-through mode forwards /v1/responses and /v1/messages to the upstream's own endpoints unchanged: here the
emulator's, which serve both APIs like SGLang and vLLM (cached-token counts included)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture
def responses_client(passthrough_proxy):
    c = openai.OpenAI(base_url=passthrough_proxy.base_url, api_key="sk-pt", max_retries=0, timeout=30)
    yield c
    c.close()


@pytest.fixture
def messages_client(passthrough_proxy):
    c = anthropic.Anthropic(base_url=passthrough_proxy.url, api_key="sk-pt", max_retries=0, timeout=30)
    yield c
    c.close()


def test_responses_chained_by_the_upstream(responses_client):
    first = responses_client.responses.create(model="m", input="Hello there, friend [[len:20]]", instructions="Hi.")
    assert first.status == "completed" and first.output_text
    second = responses_client.responses.create(model="m", input="And again [[len:5]]", previous_response_id=first.id,
                                               instructions="Hi.")
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 2
    with responses_client.responses.stream(model="m", input="Streamed [[len:12]]") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text and final.output_text == text and final.usage.output_tokens > 0
    called = responses_client.responses.create(model="m", tools=[WEATHER],
                                               input='Weather? [[call:get_weather {"city": "Rome"}]]')
    assert json.loads(called.output[0].arguments) == {"city": "Rome"}
    with pytest.raises(openai.BadRequestError):
        responses_client.responses.create(model="m", input="x", previous_response_id="resp_unknown")


def test_messages_served_by_the_upstream(messages_client):
    messages = [{"role": "user", "content": "Hello there, friend [[len:20]]"}]
    first = messages_client.messages.create(model="m", max_tokens=50, system="Hi.", messages=messages)
    assert first.content[0].text and first.stop_reason == "end_turn"
    messages += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "More [[len:4]]"}]
    second = messages_client.messages.create(model="m", max_tokens=50, system="Hi.", messages=messages)
    assert second.usage.cache_read_input_tokens > 0
    with messages_client.messages.stream(model="m", max_tokens=50, messages=[
            {"role": "user", "content": 'Weather? [[call:get_weather {"city": "Rome"}]]'}],
            tools=[{"name": "get_weather", "input_schema": WEATHER["parameters"]}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Rome"}
    assert messages_client.messages.count_tokens(model="m", messages=messages).input_tokens > 20
    with pytest.raises(anthropic.BadRequestError) as bad:
        messages_client.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "[[status:400]]"}])
    assert bad.value.body["type"] == "error"
