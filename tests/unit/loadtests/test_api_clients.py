"""The benchmarks' Responses and Messages clients and the proxy's codecs, written independently, agree: a chat
conversation sent through either API reaches the turn as the same chat messages."""

from __future__ import annotations

from loadtests.api_clients import anthropic_messages, responses_items
from memci_proxy.api.messages_codec import chat_messages
from memci_proxy.api.responses_codec import input_messages

HISTORY = [
    {"role": "user", "content": "Fix the bug"},
    {"role": "assistant", "content": "Looking.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}},
        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": '{"path": "b.py"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
    {"role": "tool", "tool_call_id": "c2", "content": "print(2)"},
    {"role": "assistant", "content": "Done."},
    {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                 {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
]


def test_responses_items_reach_the_turn_unchanged():
    assert input_messages(responses_items(HISTORY)) == HISTORY


def test_anthropic_messages_reach_the_turn_unchanged():
    assert chat_messages(anthropic_messages(HISTORY)) == HISTORY
