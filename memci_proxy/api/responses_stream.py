"""The Responses API's stream events, translated from a managed turn's chat-completions events as they come.

response.created, response.in_progress, then per output item: response.output_item.added, for a message
response.content_part.added, response.output_text.delta..., response.output_text.done, response.content_part.done;
for a function call response.function_call_arguments.delta..., response.function_call_arguments.done; for reasoning
response.reasoning_text.delta...; response.output_item.done; last response.completed (or response.failed) with
the whole Response, usage included. Every event carries a sequence_number, as the openai SDK's stream helpers expect.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from memci_proxy.api.responses_codec import (
    function_call_item, message_item, new_id, tool_kinds, reasoning_item, response_object, text_part,
)
from memci_proxy.wire.chunks import Completion, Delta, translated

_encode = msgspec.json.Encoder().encode


class _Events:
    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(payload) + b"\n\n"


async def response_events(
    request: dict[str, Any], response_id: str, chat_events: AsyncIterator[bytes],
    on_done: Callable[[dict[str, Any]], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The Responses events of one streamed turn. ``on_done`` gets the finished Response before
    response.completed goes out (the chain behind previous_response_id is kept there)."""
    event = _Events()
    created = int(time.time())
    done = Completion()
    kinds = tool_kinds(request.get("tools"))
    output: list[dict[str, Any]] = []  # finished items, by output index
    open_item: dict[str, Any] | None = None

    def start() -> dict[str, Any]:
        return response_object(request, response_id, created, "in_progress", str(request.get("model") or ""), [])

    yield event("response.created", response=start())
    yield event("response.in_progress", response=start())

    def close() -> list[bytes]:
        nonlocal open_item
        item, open_item = open_item, None
        if item is None:
            return []
        index = len(output)
        out: list[bytes] = []
        if item["type"] == "message":
            text = item.pop("_text")
            out.append(event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                             text=text, logprobs=[]))
            out.append(event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                             part=text_part(text)))
            item = message_item(item["id"], text, "completed")
        elif item["type"] == "function_call":
            call = done.tool_calls[item.pop("_call")]
            item = function_call_item(item["id"], call.id, call.name, call.arguments, "completed", kinds)
            if item["type"] == "custom_tool_call":  # its text is known once the arguments are whole
                out.append(event("response.custom_tool_call_input.delta", item_id=item["id"], output_index=index,
                                 delta=item["input"]))
                out.append(event("response.custom_tool_call_input.done", item_id=item["id"], output_index=index,
                                 input=item["input"]))
            else:
                out.append(event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                 name=call.name, arguments=call.arguments))
        else:
            text = item.pop("_text")
            out.append(event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                             content_index=0, text=text))
            item = reasoning_item(item["id"], text)
        output.append(item)
        out.append(event("response.output_item.done", output_index=index, item=item))
        return out

    def reopen(kind: str, prefix: str, **extra: Any) -> list[bytes]:
        """The open item closed, and a new one of ``kind`` opened (its output_item.added event, and for a message
        its content part)."""
        nonlocal open_item
        out = close()
        index = len(output)
        open_item = {"id": new_id(prefix), "type": kind, "_text": "", **extra}
        if kind == "reasoning":
            out.append(event("response.output_item.added", output_index=index,
                             item={"id": open_item["id"], "type": "reasoning", "summary": []}))
        elif kind == "message":
            out.append(event("response.output_item.added", output_index=index,
                             item=message_item(open_item["id"], None, "in_progress")))
            out.append(event("response.content_part.added", item_id=open_item["id"], output_index=index,
                             content_index=0, part=text_part("")))
        else:
            call = done.tool_calls[extra["_call"]]
            added = function_call_item(open_item["id"], call.id, call.name, "", "in_progress", kinds)
            open_item["id"], open_item["custom"] = added["id"], added["type"] == "custom_tool_call"
            out.append(event("response.output_item.added", output_index=index, item=added))
        return out

    def translate(delta: Delta) -> list[bytes]:
        out: list[bytes] = []
        if delta.reasoning:
            if open_item is None or open_item["type"] != "reasoning":
                out += reopen("reasoning", "rs")
            open_item["_text"] += delta.reasoning
            out.append(event("response.reasoning_text.delta", item_id=open_item["id"], output_index=len(output),
                             content_index=0, delta=delta.reasoning))
        elif delta.text:
            if open_item is None or open_item["type"] != "message":
                out += reopen("message", "msg")
            open_item["_text"] += delta.text
            out.append(event("response.output_text.delta", item_id=open_item["id"], output_index=len(output),
                             content_index=0, delta=delta.text, logprobs=[]))
        elif delta.call is not None:
            if delta.call_started:
                out += reopen("function_call", "fc", _call=delta.call)
            if (delta.arguments and open_item is not None and open_item.get("_call") == delta.call
                    and not open_item["custom"]):  # a freeform tool's text goes out whole, at its end
                out.append(event("response.function_call_arguments.delta", item_id=open_item["id"],
                                 output_index=len(output), delta=delta.arguments))
        return out

    async for e in translated(chat_events, done, translate):
        yield e
    for e in close():
        yield e
    if done.error is not None:
        error = {"code": str(done.error.get("code") or "server_error"), "message": str(done.error.get("message") or "")}
        yield event("response.failed", response=response_object(
            request, response_id, created, "failed", done.model, output, done.usage, error=error))
        return
    if not output:  # an empty answer is still one (empty) message
        item = message_item(new_id("msg"), "", "completed")
        yield event("response.output_item.added", output_index=0, item=message_item(item["id"], None, "in_progress"))
        output.append(item)
        yield event("response.output_item.done", output_index=0, item=item)
    final = response_object(request, response_id, created, "completed", done.model, output, done.usage,
                            done.finish_reason)
    await on_done(final)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield event(kind, response=final)
