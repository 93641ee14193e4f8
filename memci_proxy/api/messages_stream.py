"""Anthropic's stream events, translated from a managed turn's chat-completions events as they come.

message_start, then per content block content_block_start, content_block_delta (text_delta, input_json_delta,
thinking_delta and a signature_delta), content_block_stop; last message_delta (stop_reason and usage, the cached
part as cache_read_input_tokens) and message_stop. An error in the stream is an `error` event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec

from memci_proxy.api.messages_codec import message_usage, new_id, stop_reason
from memci_proxy.wire.chunks import Completion, Delta, translated

_encode = msgspec.json.Encoder().encode


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _encode({"type": kind, **fields}) + b"\n\n"


async def message_events(model: str, chat_events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    done = Completion()
    yield _event("message_start", message={
        "id": new_id("msg"), "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": message_usage(None)})
    index = -1
    open_kind: str | None = None
    open_call: int | None = None

    def stop() -> list[bytes]:
        nonlocal open_kind, open_call
        if open_kind is None:
            return []
        out = [_event("content_block_delta", index=index, delta={"type": "signature_delta", "signature": ""})] \
            if open_kind == "thinking" else []
        open_kind, open_call = None, None
        return [*out, _event("content_block_stop", index=index)]

    def start(kind: str, block: dict[str, Any]) -> list[bytes]:
        nonlocal index, open_kind
        out = stop()
        index += 1
        open_kind = kind
        return [*out, _event("content_block_start", index=index, content_block=block)]

    def translate(delta: Delta) -> list[bytes]:
        nonlocal open_call
        out: list[bytes] = []
        if delta.reasoning:
            if open_kind != "thinking":
                out += start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(_event("content_block_delta", index=index, delta={"type": "thinking_delta",
                                                                         "thinking": delta.reasoning}))
        elif delta.text:
            if open_kind != "text":
                out += start("text", {"type": "text", "text": ""})
            out.append(_event("content_block_delta", index=index, delta={"type": "text_delta", "text": delta.text}))
        elif delta.call is not None:
            if delta.call_started:
                call = done.tool_calls[delta.call]
                out += start("tool_use", {"type": "tool_use", "id": call.id or new_id("toolu"), "name": call.name,
                                          "input": {}})
                open_call = delta.call
            if delta.arguments and open_call == delta.call:
                out.append(_event("content_block_delta", index=index, delta={"type": "input_json_delta",
                                                                             "partial_json": delta.arguments}))
        return out

    async for e in translated(chat_events, done, translate):
        yield e
    for e in stop():
        yield e
    if done.error is not None:
        yield _event("error", error={"type": "api_error", "message": str(done.error.get("message") or "")})
        return
    if index < 0:  # an empty answer is still one (empty) text block
        yield _event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        yield _event("content_block_stop", index=0)
    yield _event("message_delta", delta={"stop_reason": stop_reason(done.finish_reason) or "end_turn",
                                         "stop_sequence": None}, usage=message_usage(done.usage))
    yield _event("message_stop")
