"""Bookkeeping shared by the streaming and non-streaming recall loops: calls, usage sums, hidden messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str = ""

    def as_message_call(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def add_usage(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Usage summed over the rounds, cached tokens included."""
    if not isinstance(usage, dict):
        return total
    if total is None:
        total = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(key)
        if isinstance(value, int):
            total[key] = total.get(key, 0) + value
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        mine = total.setdefault("prompt_tokens_details", {"cached_tokens": 0})
        mine["cached_tokens"] = mine.get("cached_tokens", 0) + details["cached_tokens"]
    for key, value in usage.items():  # keep other fields of the last round as they are
        total.setdefault(key, value)
    return total


@dataclass
class LoopRecord:
    """What the recall rounds of one request did (for the state, metrics and the client's usage)."""

    rounds: int = 0
    hidden: list[dict[str, Any]] = field(default_factory=list)  # assistant recall-call messages + tool results
    pages_recalled: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    search_seconds: list[float] = field(default_factory=list)
    first_usage: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    streamed_text: str | None = None  # a streamed answer of one round, one plain message: its text (counted by
    # the round's completion tokens)
    # A streamed answer the upstream ended with a failure (the client got an error event): (kind, status, detail),
    # kinds as memci_proxy.upstream.failures; None when it finished.
    failure: tuple[str, int | None, str] | None = None

    def observe_usage(self, usage: dict[str, Any] | None) -> None:
        if isinstance(usage, dict):
            if self.first_usage is None:
                self.first_usage = usage
            self.usage = add_usage(self.usage, usage)


def assistant_call_message(content: str | None, calls: list[ToolCall], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The assistant message of a recall round the proxy keeps (a model-called one, or the proactive push). Its
    content is a string, "" without text: the shape every OpenAI-compatible server accepts beside ``tool_calls``
    (OpenAI also takes null; llama-cpp-python's server, among others, rejects it). Rounds stored before this shape
    keep their null content: their bytes, and so the upstream's cached prefix, stay as they were
    (``memci_proxy.turn.shapes`` answers an upstream that refuses them)."""
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    message["tool_calls"] = [c.as_message_call() for c in calls]
    if extra:
        message.update(extra)
    return message


def tool_result_message(call: ToolCall, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": text}
