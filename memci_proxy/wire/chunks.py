"""Reading a chat-completions event stream as decoded chunks: what the Responses and Messages codecs translate."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from memci_proxy.wire.sse import event_data

_decode = msgspec.json.Decoder().decode


@dataclass(slots=True)
class ToolCallSoFar:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class Completion:
    """A chat completion's first choice, gathered from a whole body or from a stream's chunks."""

    id: str = ""
    model: str = ""
    created: int = 0
    content: str = ""
    reasoning: str = ""
    tool_calls: dict[int, ToolCallSoFar] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None  # an error event in the stream (an upstream cut, an upstream error)


def completion_of_body(body: dict[str, Any]) -> Completion:
    """A whole chat completion body as a Completion (its first choice)."""
    done = Completion(id=str(body.get("id") or ""), model=str(body.get("model") or ""),
                      created=int(body.get("created") or 0))
    usage = body.get("usage")
    done.usage = usage if isinstance(usage, dict) else None
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = message.get("content")
    done.content = content if isinstance(content, str) else text_of_parts(content)
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    done.reasoning = reasoning if isinstance(reasoning, str) else ""
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        done.tool_calls[i] = ToolCallSoFar(str(call.get("id") or ""), str(function.get("name") or ""),
                                           str(function.get("arguments") or ""))
    done.finish_reason = choice.get("finish_reason")
    return done


def text_of_parts(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))


@dataclass(slots=True)
class Delta:
    """One chunk's news: text, reasoning text, a tool call's start or arguments (``call`` is its index)."""

    text: str = ""
    reasoning: str = ""
    call: int | None = None
    call_started: bool = False
    arguments: str = ""


async def chat_deltas(events: AsyncIterator[bytes], done: Completion) -> AsyncIterator[Delta]:
    """The deltas of a chat-completions stream (first choice), gathering the whole completion into ``done`` as they
    pass; an error event ends the stream with ``done.error`` set. Closing it closes ``events``."""
    try:
        async for delta in _deltas(events, done):
            yield delta
    finally:
        await aclose(events)


async def translated(events: AsyncIterator[bytes], done: Completion,
                     translate: Callable[[Delta], list[bytes]]) -> AsyncIterator[bytes]:
    """A chat-completions stream translated delta by delta into another API's events (``translate``)."""
    deltas = chat_deltas(events, done)
    try:
        async for delta in deltas:
            for out in translate(delta):
                yield out
    finally:
        await deltas.aclose()


async def aclose(events: AsyncIterator[Any]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()


async def _deltas(events: AsyncIterator[bytes], done: Completion) -> AsyncIterator[Delta]:
    async for event in events:
        data = event_data(event)
        if not data or data == b"[DONE]":
            continue
        try:
            chunk = _decode(data)
        except msgspec.DecodeError:
            done.error = {"message": "the upstream sent an event that is not JSON", "type": "upstream_error",
                          "code": "upstream_malformed"}
            return
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("error"), dict):
            done.error = chunk["error"]
            return
        done.id = done.id or str(chunk.get("id") or "")
        done.model = done.model or str(chunk.get("model") or "")
        done.created = done.created or int(chunk.get("created") or 0)
        if isinstance(chunk.get("usage"), dict):
            done.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if choice.get("finish_reason"):
                done.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                done.reasoning += reasoning
                yield Delta(reasoning=reasoning)
            text = delta.get("content")
            if isinstance(text, str) and text:
                done.content += text
                yield Delta(text=text)
            for call in delta.get("tool_calls") or []:
                index = call.get("index", 0)
                function = call.get("function") or {}
                so_far = done.tool_calls.get(index)
                started = so_far is None
                if so_far is None:
                    so_far = done.tool_calls[index] = ToolCallSoFar()
                so_far.id = so_far.id or str(call.get("id") or "")
                so_far.name = so_far.name or str(function.get("name") or "")
                arguments = function.get("arguments") or ""
                so_far.arguments += arguments
                yield Delta(call=index, call_started=started, arguments=arguments)


def usage_numbers(usage: dict[str, Any] | None) -> tuple[int, int, int]:
    """(prompt tokens, cached prompt tokens, completion tokens) of a chat-completions usage object."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(usage.get("prompt_tokens") or 0), int(cached or 0), int(usage.get("completion_tokens") or 0)
