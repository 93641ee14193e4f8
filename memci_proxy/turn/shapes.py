"""How the proxy's own messages (its kept recall rounds) go to an upstream, and the fallback when one refuses them.

A recall round is an assistant message calling the recall tool and the tool results that answer it, kept in the
history byte for byte (model-called or pushed). New rounds carry ``content: ""`` (``memci_proxy.recall.tool.rounds``);
rounds stored earlier carry ``content: null``, kept as they are so that their conversations' cached prefixes stay
intact. Some OpenAI-compatible servers refuse one shape or the other (llama-cpp-python's: 500, content must be a
string), or tool messages altogether. When an upstream refuses a request that holds such rounds, the turn is sent again
in the next shape of ``SHAPES``, and the shape that was accepted is remembered for that upstream (``ShapeChoice``), so
later turns render the same bytes every time (their prefix stays cached):

- ``as_sent``: the rounds as kept;
- ``strings``: a null content becomes "" (only tried when a round has one);
- ``text``: each round becomes one assistant message holding its results as text (no tool call, no tool message);
- ``omit``: the rounds are left out (an assistant message of the client's own tool calls stays, without them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any

log = logging.getLogger("memci.turn")
SHAPES = ("as_sent", "strings", "text", "omit")
RECALLED = "(recalled from earlier in this conversation)"
MAX_UPSTREAMS = 256  # upstream URLs remembered


def _name(call: Any) -> str | None:
    function = call.get("function") if isinstance(call, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def call_id(value: Any) -> str | None:
    """A tool call's id or a tool message's ``tool_call_id`` when it is a string (a client may send anything)."""
    return value if isinstance(value, str) else None


def recall_calls(message: dict[str, Any], recall_name: str) -> list[dict[str, Any]]:
    """The calls of the recall tool in an assistant message ([] in any other message)."""
    if message.get("role") != "assistant" or not isinstance(message.get("tool_calls"), list):
        return []
    return [c for c in message["tool_calls"] if _name(c) == recall_name]


def holds_rounds(messages: Sequence[dict[str, Any]], recall_name: str) -> bool:
    """Whether the messages hold a recall round (only the proxy makes them: the client never sees the tool)."""
    return any(recall_calls(m, recall_name) for m in messages if isinstance(m, dict))


def _has_null(messages: Sequence[dict[str, Any]], recall_name: str) -> bool:
    return any(m.get("content") is None and recall_calls(m, recall_name) for m in messages if isinstance(m, dict))


def next_shape(shape: str, messages: Sequence[dict[str, Any]], recall_name: str) -> str | None:
    """The shape to try after ``shape`` was refused (None: none left)."""
    i = SHAPES.index(shape) + 1
    if i < len(SHAPES) and SHAPES[i] == "strings" and not _has_null(messages, recall_name):
        i += 1
    return SHAPES[i] if i < len(SHAPES) else None


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def render(messages: list[dict[str, Any]], shape: str, recall_name: str) -> list[dict[str, Any]]:
    """The messages with their recall rounds in ``shape`` (the same list when there is nothing to change)."""
    if shape == "as_sent" or not holds_rounds(messages, recall_name):
        return messages
    if shape == "strings":
        return [{**m, "content": ""} if m.get("content") is None and recall_calls(m, recall_name) else m
                for m in messages]
    ids = {i for m in messages for c in recall_calls(m, recall_name) if (i := call_id(c.get("id"))) is not None}
    results = {m["tool_call_id"]: _result_text(m.get("content")) for m in messages
               if m.get("role") == "tool" and call_id(m.get("tool_call_id")) in ids}
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool" and call_id(m.get("tool_call_id")) in ids:
            continue
        mine = recall_calls(m, recall_name)
        if not mine:
            out.append(m)
            continue
        others = [c for c in m["tool_calls"] if _name(c) != recall_name]
        content = _result_text(m.get("content"))
        if shape == "text":
            notes = [f"{RECALLED} {_name(c)} {(c.get('function') or {}).get('arguments', '')}:\n"
                     f"{results.get(call_id(c.get('id')), '')}" for c in mine]
            content = "\n\n".join([content, *notes] if content else notes)
        message = {k: v for k, v in m.items() if k != "tool_calls"}
        message["content"] = content
        if others:
            message["tool_calls"] = others
        elif not content:
            continue  # omitted: nothing left of it
        out.append(message)
    return out


Shape = Callable[[dict[str, Any]], dict[str, Any]]  # a request body -> the body with its rounds in one shape


def renderer(shape: str, recall_name: str) -> Shape:
    """The body transform of one shape (the same body when nothing changes)."""
    def apply(body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return body
        shaped = render(messages, shape, recall_name)
        return body if shaped is messages else {**body, "messages": shaped}

    return apply


async def resend(send: Callable[[dict[str, Any], Shape], Awaitable[Any]], body: dict[str, Any], shape: str,
                 recall_name: str, refusals: Collection[int]) -> tuple[Any, str | None]:
    """After ``shape`` was refused: ``body`` sent again (``send(shaped body, transform)``) in each next shape until the
    upstream takes one. Returns (its answer, that shape); (an answer, None) when the upstream answered something
    other than a refusal; (None, None) when every shape was refused."""
    while (next_one := next_shape(shape, body["messages"], recall_name)) is not None:
        shape = next_one
        apply = renderer(shape, recall_name)
        answer = await send(apply(body), apply)
        if answer.events is not None or answer.status == 200:
            return answer, shape
        if answer.status not in refusals:
            return answer, None
    return None, None


class ShapeChoice:
    """The shape each upstream (by URL) accepted, once one refused the rounds as sent; bounded."""

    def __init__(self) -> None:
        self._chosen: dict[str, str] = {}

    def shape(self, upstream: str) -> str:
        return self._chosen.get(upstream, "as_sent")

    def choose(self, upstream: str, shape: str, status: int) -> None:
        if self._chosen.get(upstream) == shape:
            return
        if len(self._chosen) >= MAX_UPSTREAMS:
            self._chosen.pop(next(iter(self._chosen)))
        self._chosen[upstream] = shape
        log.warning("the upstream %s refused the proxy's recall rounds (HTTP %d); they are sent as %r from now on",
                    upstream, status, shape)

    def renderer(self, upstream: str, recall_name: str) -> Shape | None:
        """A body transform for the upstream's chosen shape (None: as sent)."""
        shape = self.shape(upstream)
        return None if shape == "as_sent" else renderer(shape, recall_name)
