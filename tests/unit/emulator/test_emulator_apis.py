"""The emulator's Responses and Messages endpoints: each request planned as the chat it renders to."""

from __future__ import annotations

import json

from memci_proxy.emulator.apis import (
    ResponsesBook, message_body, message_stream, messages_chat, response_body, response_messages, responses_chat,
)
from memci_proxy.emulator.chat import plan_chat
from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.emulator.state import EmulatorState


def test_a_responses_chain_is_kept_and_cached():
    state, book = EmulatorState(EmulatorConfig()), ResponsesBook()
    chat, conversation = responses_chat({"model": "m", "instructions": "Be brief.", "input": "Hello [[len:5]]"}, [])
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello [[len:5]]"}]
    plan = plan_chat(state, chat)
    body = response_body(plan)
    book.keep(body["id"], conversation + response_messages(plan))
    follow = {"model": "m", "instructions": "Be brief.", "input": "More [[len:5]]", "previous_response_id": body["id"]}
    chat2, _ = responses_chat(follow, book.history(follow))
    assert [m["role"] for m in chat2["messages"]] == ["system", "user", "assistant", "user"]
    second = response_body(plan_chat(state, chat2))
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= body["usage"]["input_tokens"] - 2


def test_messages_usage_and_stream():
    state = EmulatorState(EmulatorConfig())
    chat = messages_chat({"model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "S"}],
                          "messages": [{"role": "user", "content": 'Go [[call:f {"a": 1}]]'}],
                          "tools": [{"name": "f", "input_schema": {"type": "object"}}]})
    plan = plan_chat(state, chat)
    body = message_body(plan)
    assert body["stop_reason"] == "tool_use" and body["content"][-1]["input"] == {"a": 1}
    assert body["usage"]["input_tokens"] + body["usage"]["cache_read_input_tokens"] == plan.prompt_tokens
    kinds = [json.loads(e.split(b"\ndata: ", 1)[1])["type"] for e, _ in message_stream(plan, state.tokenizer, 4)]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert "content_block_start" in kinds and "content_block_stop" in kinds
