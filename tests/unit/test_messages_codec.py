"""The Anthropic Messages codec: blocks to chat messages and back, errors, and the stream translation."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest

from memci_proxy.api.messages_codec import chat_messages, chat_request, error_of_openai, message_of, system_text
from memci_proxy.api.messages_stream import message_events
from memci_proxy.wire.chunks import Completion, ToolCallSoFar
from memci_proxy.wire.errors import ProxyError


def test_system_as_string_or_blocks():
    assert system_text("be brief") == "be brief"
    assert system_text([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "b"}]) == "a\n\nb"
    with pytest.raises(ProxyError):
        system_text([{"type": "image"}])


def test_blocks_become_chat_messages():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                                                  "data": "AAAA"}}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                                     {"type": "tool_result", "tool_use_id": "t2", "is_error": True,
                                      "content": [{"type": "text", "text": "boom"}]}]},
    ]
    assert chat_messages(messages) == [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}}]},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "hmm", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
    ]


def test_a_system_message_mid_conversation_stays_in_place():
    messages = [{"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "text", "text": "note"}]},
                {"role": "assistant", "content": "ok"}]
    assert chat_messages(messages) == [{"role": "user", "content": "hi"}, {"role": "system", "content": "note"},
                                       {"role": "assistant", "content": "ok"}]


def test_an_answer_resent_gives_the_same_messages():
    done = Completion(content="Sure.", reasoning="hmm", tool_calls={0: ToolCallSoFar("t9", "f", '{"x": [1, 2]}')},
                      finish_reason="tool_calls")
    message = message_of(done, "m")
    assert message["stop_reason"] == "tool_use"
    resent = msgspec.json.decode(msgspec.json.encode({"role": "assistant", "content": message["content"]}))
    assert chat_messages([resent]) == [{"role": "assistant", "content": "Sure.", "reasoning_content": "hmm",
                                        "tool_calls": [{"id": "t9", "type": "function",
                                                        "function": {"name": "f", "arguments": '{"x": [1, 2]}'}}]}]


def test_the_chat_request():
    data = {"model": "m", "max_tokens": 50, "system": "s", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stop_sequences": ["END"],
            "metadata": {"user_id": "u1"}, "top_k": 5, "thinking": {"type": "enabled", "budget_tokens": 10}}
    assert chat_request(data) == {
        "model": "m", "top_k": 5, "max_tokens": 50,
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": "required", "parallel_tool_calls": False, "stop": ["END"], "user": "u1",
        "reasoning_effort": "low"}


@pytest.mark.parametrize("fields, effort", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
    ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, "medium"),
    ({"thinking": {"type": "enabled", "budget_tokens": 31999}}, "high"),
    ({"thinking": {"type": "disabled"}}, None),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "output_config": {"effort": "high"}}, "high"),
    ({"output_config": {"effort": "max"}}, "high"),
    ({"output_config": {"format": {"type": "json_schema"}}}, None),
])
def test_thinking_and_effort_become_reasoning_effort(fields, effort):
    chat = chat_request({"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}], **fields})
    assert chat.get("reasoning_effort") == effort and "thinking" not in chat and "output_config" not in chat


@pytest.mark.parametrize("data, param", [
    ({"messages": []}, "max_tokens"),
    ({"max_tokens": 5}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages.0.content.0.type"),
    ({"max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "w"}]}, "tools.0"),
])
def test_bad_requests_name_the_field(data, param):
    with pytest.raises(ProxyError) as err:
        chat_request(data)
    assert err.value.status == 400 and err.value.param == param


def test_errors_in_anthropic_shape():
    body = error_of_openai(429, b'{"error": {"message": "slow down", "type": "rate_limit_error"}}')
    assert json.loads(body) == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert json.loads(error_of_openai(502, b"gateway"))["error"] == {"type": "api_error", "message": "gateway"}


def test_usage_counts_the_cached_part_apart():
    done = Completion(content="x", finish_reason="stop",
                      usage={"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 90}})
    assert message_of(done, "m")["usage"] == {"input_tokens": 10, "cache_creation_input_tokens": 0,
                                              "cache_read_input_tokens": 90, "output_tokens": 5}


def _chunk(delta=None, finish=None, usage=None) -> bytes:
    body = {"id": "c", "model": "m", "choices": [] if delta is None else [{"index": 0, "delta": delta,
                                                                           "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _events(chunks):
    async def source():
        for c in chunks:
            yield c

    out = []
    async for raw in message_events("m", source()):
        name, data = raw.decode().split("\n", 1)
        payload = json.loads(data[len("data: "):])
        assert name == "event: " + payload["type"]
        out.append(payload)
    return out


def test_the_stream_translation():
    events = asyncio.run(_events([
        _chunk({"reasoning_content": "hm"}), _chunk({"content": "Hi"}),
        _chunk({"tool_calls": [{"index": 0, "id": "t1", "function": {"name": "f", "arguments": "{\"a\""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}), _chunk({}, "tool_calls"),
        _chunk(usage={"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}),
        b"data: [DONE]\n\n"]))
    assert [(e["type"], e.get("index"), (e.get("delta") or {}).get("type")) for e in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, None), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, None), ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, None), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert events[8]["content_block"] == {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
    assert events[-2]["usage"] == {"input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4,
                                   "output_tokens": 3}


def test_a_stream_error_is_an_error_event():
    events = asyncio.run(_events([_chunk({"content": "x"}), b'data: {"error": {"message": "cut"}}\n\n']))
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "cut"}}
