"""OpenAI response bodies and server-sent events for a planned chat completion."""

from __future__ import annotations

from itertools import zip_longest
from typing import Any

from memci_proxy.emulator.jsontext import encode as _encode

from memci_proxy.emulator.chat import SYSTEM_FINGERPRINT, ChatPlan, ChoicePlan
from memci_proxy.emulator.tokenizer import Tokenizer

DONE_EVENT = b"data: [DONE]\n\n"
MALFORMED_EVENT = b'data: {"id": "chatcmpl-malformed", "choices": [{"delta": {"content": "unterminated\n\n'


def sse(payload: Any) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


def chat_completion_body(plan: ChatPlan) -> dict[str, Any]:
    choices = []
    for choice in plan.choices:
        message: dict[str, Any] = {"role": "assistant", "content": choice.content, "refusal": None}
        if choice.tool_calls:
            message["tool_calls"] = [call.as_openai() for call in choice.tool_calls]
        choices.append({"index": choice.index, "message": message, "logprobs": None, "finish_reason": choice.finish_reason})
    return {
        "id": plan.request_id,
        "object": "chat.completion",
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": choices,
        "usage": plan.usage(),
    }


def _choice_deltas(
    choice: ChoicePlan, tokenizer: Tokenizer, chunk_tokens: int
) -> list[tuple[dict[str, Any], str | None, int]]:
    """(delta, finish_reason, output tokens carried) for one choice, role first, finish last."""
    role_delta: dict[str, Any] = {"role": "assistant", "content": None if choice.tool_calls else ""}
    deltas: list[tuple[dict[str, Any], str | None, int]] = [(role_delta, None, 0)]
    tokens = choice.content_tokens
    for start in range(0, len(tokens), chunk_tokens):
        piece = tokens[start : start + chunk_tokens]
        deltas.append(({"content": "".join(piece)}, None, len(piece)))
    for position, call in enumerate(choice.tool_calls):
        head = {"index": position, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        deltas.append(({"tool_calls": [head]}, None, 1))
        argument_tokens = tokenizer.split(call.arguments)
        for start in range(0, len(argument_tokens), chunk_tokens):
            piece = argument_tokens[start : start + chunk_tokens]
            fragment = {"index": position, "function": {"arguments": "".join(piece)}}
            deltas.append(({"tool_calls": [fragment]}, None, len(piece)))
    deltas.append(({}, choice.finish_reason, 1))
    return deltas


def chat_stream_events(plan: ChatPlan, tokenizer: Tokenizer, chunk_tokens: int) -> list[tuple[bytes, int]]:
    """Every SSE event of the stream with the output tokens it carries, [DONE] included."""
    head = {
        "id": plan.request_id,
        "object": "chat.completion.chunk",
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    per_choice = [_choice_deltas(choice, tokenizer, max(1, chunk_tokens)) for choice in plan.choices]
    events: list[tuple[bytes, int]] = []
    for row in zip_longest(*per_choice):
        for index, item in enumerate(row):
            if item is None:
                continue
            delta, finish_reason, token_count = item
            chunk = dict(head)
            chunk["choices"] = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
            if plan.include_usage:
                chunk["usage"] = None
            events.append((sse(chunk), token_count))
    if plan.include_usage:
        final = dict(head)
        final["choices"] = []
        final["usage"] = plan.usage()
        events.append((sse(final), 0))
    events.append((DONE_EVENT, 0))
    return events
