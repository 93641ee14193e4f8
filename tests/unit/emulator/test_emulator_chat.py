import json
from typing import Any

import pytest

from memci_proxy.emulator.answers import TOOL_RESULT_PREFIX
from memci_proxy.emulator.chat import plan_chat
from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.emulator.errors import ErrorReply
from memci_proxy.emulator.responses import chat_completion_body, chat_stream_events
from memci_proxy.emulator.state import EmulatorState

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def new_state(**overrides: Any) -> EmulatorState:
    return EmulatorState(EmulatorConfig(**overrides))


def assistant_message(body: dict[str, Any]) -> dict[str, Any]:
    message = dict(body["choices"][0]["message"])
    message.pop("refusal", None)
    return message


def test_cached_tokens_cover_the_previous_prompt_and_answer() -> None:
    state = new_state()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Sys"}, {"role": "user", "content": "First"}]
    first = plan_chat(state, {"messages": messages})
    assert first.cached_tokens == 0
    messages += [assistant_message(chat_completion_body(first)), {"role": "user", "content": "Second"}]
    second = plan_chat(state, {"messages": messages})
    assert second.cached_tokens == first.prompt_tokens + first.completion_tokens
    messages += [assistant_message(chat_completion_body(second)), {"role": "user", "content": "Third"}]
    third = plan_chat(state, {"messages": messages})
    assert third.cached_tokens == second.prompt_tokens + second.completion_tokens
    assert state.totals.requests == 3
    assert state.totals.cached_tokens == second.cached_tokens + third.cached_tokens


def test_cached_tokens_leave_at_least_one_prompt_token() -> None:
    state = new_state()
    body = {"messages": [{"role": "user", "content": "same"}]}
    first = plan_chat(state, body)
    again = plan_chat(state, body)
    assert again.cached_tokens == first.prompt_tokens - 1


def test_cache_accounting_across_a_tool_call_round() -> None:
    state = new_state()
    messages: list[dict[str, Any]] = [{"role": "user", "content": 'find [[call:lookup {"q": "cats"}]]'}]
    first = plan_chat(state, {"messages": messages, "tools": TOOLS})
    body = chat_completion_body(first)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "lookup", "arguments": '{"q": "cats"}'}
    assert call["id"].startswith("call_") and call["type"] == "function"
    messages += [assistant_message(body), {"role": "tool", "tool_call_id": call["id"], "content": "cats are mammals"}]
    second = plan_chat(state, {"messages": messages, "tools": TOOLS})
    assert second.cached_tokens == first.prompt_tokens + first.completion_tokens
    assert second.choices[0].tool_calls == []
    assert second.choices[0].content == TOOL_RESULT_PREFIX + "cats are mammals"


def test_tool_result_with_a_call_marker_chains_another_call() -> None:
    state = new_state()
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "partial [[call:lookup {\"page\": 2}]]"},
    ]  # fmt: skip
    plan = plan_chat(state, {"messages": messages, "tools": TOOLS})
    assert [call.arguments for call in plan.choices[0].tool_calls] == ['{"page": 2}']


def test_tool_result_answer_is_cut_at_300_characters() -> None:
    state = new_state()
    messages = [{"role": "user", "content": "go"}, {"role": "tool", "tool_call_id": "x", "content": "y" * 1000}]
    plan = plan_chat(state, {"messages": messages})
    assert plan.choices[0].content == TOOL_RESULT_PREFIX + "y" * 300


def test_calls_to_unknown_tools_or_with_tool_choice_none_answer_text() -> None:
    state = new_state()
    messages = [{"role": "user", "content": "[[call:lookup {}]]"}]
    assert plan_chat(state, {"messages": messages}).choices[0].tool_calls == []
    plan = plan_chat(state, {"messages": messages, "tools": TOOLS, "tool_choice": "none"})
    assert plan.choices[0].tool_calls == [] and plan.choices[0].finish_reason == "stop"


def test_length_marker_say_marker_and_max_tokens() -> None:
    state = new_state()
    plan = plan_chat(state, {"messages": [{"role": "user", "content": "x [[len:9]]"}]})
    assert plan.completion_tokens == 10 and plan.choices[0].finish_reason == "stop"
    plan = plan_chat(state, {"messages": [{"role": "user", "content": "x [[len:50]]"}], "max_tokens": 5})
    assert plan.completion_tokens == 5 and plan.choices[0].finish_reason == "length"
    plan = plan_chat(state, {"messages": [{"role": "user", "content": "x [[len:50]]"}], "max_completion_tokens": 7})
    assert plan.completion_tokens == 7
    plan = plan_chat(state, {"messages": [{"role": "user", "content": "[[say:Hello there, 世界!]]"}]})
    assert plan.choices[0].content == "Hello there, 世界!"


def test_answers_are_deterministic_and_distinct_per_choice() -> None:
    body = {"messages": [{"role": "user", "content": "tell me"}], "n": 3}
    first = plan_chat(new_state(), body)
    again = plan_chat(new_state(), body)
    contents = [choice.content for choice in first.choices]
    assert contents == [choice.content for choice in again.choices]
    assert len(set(contents)) == 3
    single = plan_chat(new_state(), {"messages": body["messages"]})
    assert single.choices[0].content == contents[0]
    assert first.completion_tokens == sum(choice.completion_tokens for choice in first.choices)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ],
)
def test_invalid_requests_are_400(body: Any, param: str | None) -> None:
    with pytest.raises(ErrorReply) as raised:
        plan_chat(new_state(), body)
    assert raised.value.status == 400
    assert raised.value.body()["error"]["param"] == param
    assert raised.value.body()["error"]["type"] == "invalid_request_error"


def test_context_length_is_enforced() -> None:
    state = new_state(max_model_len=50)
    with pytest.raises(ErrorReply) as raised:
        plan_chat(state, {"messages": [{"role": "user", "content": "word " * 60}]})
    assert raised.value.code == "context_length_exceeded"
    with pytest.raises(ErrorReply) as raised:
        plan_chat(state, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40})
    prompt = plan_chat(state, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).prompt_tokens
    assert raised.value.message == (
        "Requested token count exceeds the model's maximum context length of 50 tokens. You requested a total of "
        f"{prompt + 40} tokens: {prompt} tokens from the input messages and 40 tokens for the completion. Please "
        "reduce the number of tokens in the input messages or the completion to fit within the limit.")
    with pytest.raises(ErrorReply) as raised:
        plan_chat(state, {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 32000})
    assert raised.value.status == 400 and raised.value.message == (
        "max_completion_tokens is too large: 32000.This model supports at most 50 completion tokens.")


def test_lenient_context_cuts_max_tokens_to_the_window() -> None:
    state = new_state(max_model_len=50, strict_context=False)
    chat = plan_chat(state, {"messages": [{"role": "user", "content": "hi [[len:100]]"}], "max_tokens": 32000})
    assert chat.prompt_tokens + chat.choices[0].completion_tokens <= 50
    with pytest.raises(ErrorReply):  # a prompt that fills the window is refused still
        plan_chat(state, {"messages": [{"role": "user", "content": "word " * 60}]})


def test_status_marker_raises_the_status_and_logs_the_request() -> None:
    state = new_state()
    with pytest.raises(ErrorReply) as raised:
        plan_chat(state, {"messages": [{"role": "user", "content": "[[status:429]]"}]})
    assert raised.value.status == 429
    assert raised.value.body()["error"]["type"] == "rate_limit_error"
    assert state.last_requests(1)[0]["injected_status"] == 429
    assert state.totals.requests == 0


def test_request_log_keeps_bodies_and_counts() -> None:
    state = new_state(request_log_size=3)
    for index in range(5):
        plan_chat(state, {"messages": [{"role": "user", "content": f"q{index}"}]})
    logged = state.last_requests(10)
    assert [entry["body"]["messages"][0]["content"] for entry in logged] == ["q2", "q3", "q4"]
    assert all(entry["prompt_tokens"] > 0 and entry["cached_tokens"] >= 0 for entry in logged)
    state.reset()
    assert state.last_requests(10) == [] and state.cache.total_tokens == 0


def parse_events(events: list[tuple[bytes, int]]) -> tuple[list[dict[str, Any]], bool]:
    chunks = []
    done = False
    for raw, _ in events:
        assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
        data = raw[6:-2]
        if data == b"[DONE]":
            done = True
        else:
            chunks.append(json.loads(data))
    return chunks, done


def test_stream_events_text_and_usage() -> None:
    state = new_state()
    plan = plan_chat(
        state,
        {"messages": [{"role": "user", "content": "hi [[len:12]]"}], "stream": True, "stream_options": {"include_usage": True}},
    )
    chunks, done = parse_events(chat_stream_events(plan, state.tokenizer, 4))
    assert done
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(chunk["object"] == "chat.completion.chunk" and chunk["id"] == plan.request_id for chunk in chunks)
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks if chunk["choices"])
    assert text == plan.choices[0].content
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 13
    assert len(chunks) == 1 + 3 + 1 + 1


def test_stream_events_tool_call_deltas() -> None:
    state = new_state()
    plan = plan_chat(
        state,
        {
            "messages": [{"role": "user", "content": '[[call:lookup {"query": "long words here", "k": 3}]] [[call:lookup]]'}],
            "tools": TOOLS,
            "stream": True,
        },
    )
    chunks, _ = parse_events(chat_stream_events(plan, state.tokenizer, 4))
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    call_deltas = [delta["tool_calls"][0] for delta in deltas if "tool_calls" in delta]
    heads = [delta for delta in call_deltas if "id" in delta]
    assert [(head["index"], head["type"], head["function"]) for head in heads] == [
        (0, "function", {"name": "lookup", "arguments": ""}),
        (1, "function", {"name": "lookup", "arguments": ""}),
    ]
    first_fragments = [delta["function"]["arguments"] for delta in call_deltas if delta["index"] == 0 and "id" not in delta]
    assert len(first_fragments) > 2
    assert "".join(first_fragments) == '{"query": "long words here", "k": 3}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert "usage" not in chunks[-1]


def test_latency_model_splits_cached_and_uncached_prompt_tokens() -> None:
    state = new_state(per_uncached_token_s=0.001, per_cached_token_s=0.0001, per_output_token_s=0.01)
    body = {"messages": [{"role": "user", "content": "latency"}]}
    first = plan_chat(state, body)
    assert first.time_to_first_token_s == pytest.approx(first.prompt_tokens * 0.001)
    second = plan_chat(state, body)
    cached = second.cached_tokens
    assert second.time_to_first_token_s == pytest.approx((second.prompt_tokens - cached) * 0.001 + cached * 0.0001)
    assert second.per_output_token_s == 0.01
    assert plan_chat(new_state(), body).time_to_first_token_s == 0.0


def test_markers_come_from_the_last_user_message_or_trailing_tool_results() -> None:
    state = new_state()
    messages = [
        {"role": "user", "content": "old [[say:old]]"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "memory block [[status:500]]"},
        {"role": "user", "content": "new [[say:new]]"},
    ]
    assert plan_chat(state, {"messages": messages}).choices[0].content == "new"
    after_tools = [
        {"role": "user", "content": "[[call:lookup]]"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "system", "content": "note appended after the results"},
    ]  # fmt: skip
    plan = plan_chat(state, {"messages": after_tools, "tools": TOOLS})
    assert plan.choices[0].tool_calls == [] and plan.choices[0].content == TOOL_RESULT_PREFIX + "found"


@pytest.mark.parametrize("content", ["plain [[len:30]]", "[[say:Spaces  and\nnew lines, 中文 too.]]", "[[len:30]]"])
@pytest.mark.parametrize("max_tokens", [None, 7])
def test_inserted_output_equals_the_rendered_answer_tokens(content: str, max_tokens: int | None) -> None:
    from memci_proxy.emulator.template import render_output

    state = new_state()
    plan = plan_chat(state, {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})
    choice = plan.choices[0]
    expected = state.tokenizer.encode(render_output(choice.content, None, choice.finish_reason == "stop"))
    assert choice.completion_tokens == len(expected)
    assert state.tokenizer.split(choice.content or "") == choice.content_tokens
