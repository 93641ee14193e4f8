"""The Responses codec: input items to chat messages and back, and the stream translation."""

from __future__ import annotations

import asyncio
import json
import re

import msgspec
import pytest

from memci_proxy.api.responses_codec import (assistant_messages, chat_request, input_messages, output_items, qualified_name,
                                       response_of, tool_names)
from memci_proxy.api.responses_stream import response_events
from memci_proxy.wire.chunks import Completion, ToolCallSoFar
from memci_proxy.wire.errors import ProxyError


def test_a_string_is_one_user_message():
    assert input_messages("hi") == [{"role": "user", "content": "hi"}]


def test_items_become_chat_messages():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "look"},
                                     {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ]
    assert input_messages(items) == [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
        {"role": "assistant", "content": "Let me check.", "reasoning_content": "thinking", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"a\":1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]


def test_an_answer_resent_as_input_gives_the_same_messages():
    """What the proxy keeps behind previous_response_id is what a stateless client resending the output gives."""
    done = Completion(content="Sure.", reasoning="hmm", tool_calls={0: ToolCallSoFar("c9", "f", "{}")})
    output = output_items(done)
    resent = msgspec.json.decode(msgspec.json.encode(output))
    assert assistant_messages(output) == input_messages(resent) == [
        {"role": "assistant", "content": "Sure.", "reasoning_content": "hmm",
         "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]


def test_the_chat_request_keeps_unknown_fields_and_maps_known_ones():
    data = {"model": "m", "input": "x", "instructions": "sys", "max_output_tokens": 9, "store": True,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"}, "top_k": 3, "reasoning": {"effort": "low"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}, "stream": True}
    chat = chat_request(data, input_messages("x"))
    assert chat == {
        "model": "m", "top_k": 3, "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "max_tokens": 9, "reasoning_effort": "low",
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}},
        "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("bad, param", [
    (None, "input"), (3, "input"), ([{"type": "web_search_call"}], "input[0].type"),
    ([{"role": "robot", "content": "x"}], "input[0].role"),
    ([{"role": "user", "content": [{"type": "input_audio"}]}], "input[0].content"),
])
def test_bad_input_is_a_400_naming_the_field(bad, param):
    with pytest.raises(ProxyError) as err:
        input_messages(bad)
    assert err.value.status == 400 and err.value.param == param


def test_non_function_tools_are_refused():
    with pytest.raises(ProxyError) as err:
        chat_request({"input": "x", "tools": [{"type": "shell_2099"}]}, [])
    assert err.value.param == "tools[0]"


def test_usage_and_length():
    done = Completion(content="abc", finish_reason="length",
                      usage={"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}})
    r = response_of({"model": "m"}, "resp_1", done)
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 2,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12}


def _chunk(delta=None, finish=None, usage=None) -> bytes:
    body = {"id": "c", "model": "m", "created": 1, "choices": [] if delta is None else [
        {"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _events(chunks: list[bytes]) -> list[dict]:
    async def source():
        for c in chunks:
            yield c

    kept = []

    async def keep(response):
        kept.append(response)

    out = []
    async for raw in response_events({"model": "m"}, "resp_x", source(), keep):
        name, data = raw.decode().split("\n", 1)
        payload = json.loads(data[len("data: "):])
        assert name == "event: " + payload["type"]
        out.append(payload)
    assert len(kept) == (1 if out[-1]["type"] == "response.completed" else 0)
    return out


def test_the_stream_translation():
    events = asyncio.run(_events([
        _chunk({"role": "assistant", "content": "Hel"}), _chunk({"content": "lo"}),
        _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{\"a\""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        _chunk({}, "tool_calls"),
        _chunk(usage={"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}),
        b"data: [DONE]\n\n"]))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = events[-1]["response"]
    assert [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["arguments"] == "{\"a\": 1}" and final["output"][1]["call_id"] == "c1"
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 4}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_an_error_event_fails_the_response():
    events = asyncio.run(_events([_chunk({"content": "x"}),
                                  b'data: {"error": {"message": "cut", "code": "upstream_cut"}}\n\n']))
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "upstream_cut", "message": "cut"}


def test_namespaces_are_flattened_and_hosted_tools_left_out():
    tools = [{"type": "web_search", "external_web_access": False},
             {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn",
                                                                "parameters": {"type": "object"}}]}]
    chat = chat_request({"input": "x", "tools": tools}, input_messages("x"))
    assert chat["tools"] == [{"type": "function", "function": {"name": "spawn", "parameters": {"type": "object"}}}]
    done = Completion(tool_calls={0: ToolCallSoFar("c1", "spawn", "{}")})
    r = response_of({"tools": tools}, "resp_1", done)
    assert r["output"][0]["namespace"] == "agents" and r["output"][0]["name"] == "spawn"


def test_freeform_tools_are_one_string_argument():
    tools = [{"type": "custom", "name": "apply_patch", "description": "Patch files.",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}]
    chat = chat_request({"input": "x", "tools": tools}, input_messages("x"))
    assert chat["tools"][0]["function"]["parameters"]["required"] == ["input"]
    done = Completion(tool_calls={0: ToolCallSoFar("c1", "apply_patch", '{"input": "*** Begin Patch"}')})
    item = response_of({"tools": tools}, "resp_1", done)["output"][0]
    assert item["type"] == "custom_tool_call" and item["input"] == "*** Begin Patch" and item["call_id"] == "c1"
    resent = [item, {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"}]
    assert input_messages(resent) == [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "apply_patch", "arguments": '{"input": "*** Begin Patch"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Done!"}]


def test_a_streamed_freeform_call():
    tools = [{"type": "custom", "name": "apply_patch"}]

    async def run():
        async def source():
            yield _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "apply_patch",
                                                                                "arguments": '{"input": "*** B'}}]})
            yield _chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'egin"}'}}]})
            yield _chunk({}, "tool_calls")

        async def keep(response):
            pass

        return [json.loads(raw.decode().split("\n", 1)[1][6:])
                async for raw in response_events({"tools": tools}, "resp_x", source(), keep)]

    events = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    assert kinds[2:] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                         "response.custom_tool_call_input.done", "response.output_item.done", "response.completed"]
    assert events[-1]["response"]["output"][0]["input"] == "*** Begin"
    assert events[2]["item"]["id"] == events[-2]["item"]["id"]


def test_one_function_name_in_two_namespaces_gets_one_upstream_name_each_and_maps_back():
    lookup = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    tools = [{"type": "namespace", "name": "mcp__alpha", "tools": [lookup]},
             {"type": "namespace", "name": "mcp__beta", "tools": [lookup]},
             {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn"}]}]
    earlier = [{"type": "function_call", "call_id": "c0", "name": "lookup", "namespace": "mcp__beta",
                "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c0", "output": "ok"}]
    names = tool_names(tools)
    chat = chat_request({"input": earlier, "tools": tools, "tool_choice": {"type": "function", "name": "lookup",
                                                                            "namespace": "mcp__alpha"}},
                        input_messages(earlier, names))
    assert [t["function"]["name"] for t in chat["tools"]] == ["mcp__alpha__lookup", "mcp__beta__lookup", "spawn"]
    assert chat["messages"][0]["tool_calls"][0]["function"]["name"] == "mcp__beta__lookup"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "mcp__alpha__lookup"}}
    for upstream, namespace in (("mcp__alpha__lookup", "mcp__alpha"), ("mcp__beta__lookup", "mcp__beta")):
        done = Completion(tool_calls={0: ToolCallSoFar("c1", upstream, "{}")})
        item = response_of({"tools": tools}, "resp_1", done)["output"][0]
        assert (item["name"], item["namespace"]) == ("lookup", namespace)
        assert assistant_messages([item], names)[0]["tool_calls"][0]["function"]["name"] == upstream


def test_a_long_qualified_name_stays_a_valid_function_name():
    name = qualified_name("mcp__" + "x" * 80, "look.up")
    assert len(name) <= 64 and re.fullmatch(r"[A-Za-z0-9_-]+", name)
    assert name != qualified_name("mcp__" + "x" * 80, "look-up")
