"""Prompt layout (DESIGN 5): one leading system message (B1 + B2a + B4), B6 verbatim, volatile blocks in the
last user message."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from .condense import condense_message, condense_messages
from .markup import escape_tags, quote
from .state import HiddenGroup

VOLATILE_OPEN = "<memci-context>"
VOLATILE_CLOSE = "</memci-context>"


def system_message_text(messages: Sequence[dict[str, Any]]) -> str:
    """B1: the client's leading system/developer messages' text, verbatim, joined by blank lines; the text parts of
    one message joined by a newline, as vLLM's chat templates join them (Codex sends a developer message of several
    tagged parts: `</permissions instructions>` and the next tag stay on lines of their own)."""
    texts: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.append(
                "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
            )
    return "\n\n".join(texts)


def render_system_text(b1: str, profile: str, summary: str, contents: str) -> str | None:
    """B1 + B2a (profile) + B4 (summary, contents page); None when all are empty (no system message). The
    profile and summary are model-written from client text: quoted (proxy.engine.markup)."""
    parts = [b1, quote(profile), "## Conversation summary\n" + quote(summary) if summary else "", contents]
    text = "\n\n".join(p for p in parts if p)
    return text or None


def volatile_block(task_state: str, intent: str, memory: str) -> str:
    """B3 task state, B2b rewritten intent, B5 retrieved memory, delimited; empty when none is given. Their
    texts derive from client text: quoted, so none can close or open a tag of the block (the memory block is
    the proxy's own lines around quoted page text: only its tags are escaped)."""
    sections = []
    if task_state:
        sections.append(f"<task-state>\n{quote(task_state)}\n</task-state>")
    if intent:
        sections.append(f"<intent>\n{quote(intent)}\n</intent>")
    if memory:
        sections.append(f"<memory>\n{escape_tags(memory)}\n</memory>")
    if not sections:
        return ""
    return VOLATILE_OPEN + "\n" + "\n".join(sections) + "\n" + VOLATILE_CLOSE


def with_volatile(message: dict[str, Any], block: str) -> dict[str, Any]:
    """A copy of the user message with the volatile block appended after the client's text, in which look-alikes
    of the block's tags are escaped (the block the model reads in this message is the proxy's alone)."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [
            {**p, "text": escape_tags(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else p
            for p in content
        ]
        return {**message, "content": [*parts, {"type": "text", "text": block}]}
    if isinstance(content, str) and content:
        return {**message, "content": escape_tags(content) + "\n\n" + block}
    return {**message, "content": block}


def render_active(
    messages: Sequence[dict[str, Any]],
    start: int,
    condensed: Sequence[int],
    hidden: Sequence[HiddenGroup],
    tool_chars: int,
    volatile: Mapping[int, str],
    image_texts: Mapping[str, str] | None = None,
    previews: Mapping[int, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """B6: entries [start, len(messages)) verbatim, condensed where flagged (images decayed to `image_texts`
    when given), offloaded ones by their `previews`, hidden groups spliced in place, volatile blocks appended to
    the entries `volatile` maps."""
    cond = condensed[bisect.bisect_left(condensed, start) :]
    cond_set = set(cond)
    by_after: dict[int, list[HiddenGroup]] = {}
    for g in hidden:
        if g.after >= start:
            by_after.setdefault(g.after, []).append(g)
    points = set(cond_set)
    points.update(by_after)
    points.update(e for e, text in volatile.items() if text and e >= start)
    if previews:
        points.update(previews)
    out: list[dict[str, Any]] = []
    pos = start
    for p in sorted(points):
        if p > pos:
            out.extend(messages[pos:p])
        msg = messages[p]
        if previews and p in previews:
            msg = previews[p]
        elif p in cond_set:
            msg = condense_message(msg, tool_chars, image_texts) or msg
        block = volatile.get(p)
        if block:
            msg = with_volatile(msg, block)
        out.append(msg)
        for g in by_after.get(p, ()):
            # copies: the state's own dicts must not be reachable for changes through the upstream messages
            out.extend(map(dict, condense_messages(g.messages, tool_chars)[0] if g.condensed else g.messages))
        pos = p + 1
    if pos < len(messages):
        out.extend(messages[pos:])
    return out


def frozen_volatile(hidden: Sequence[HiddenGroup], start: int) -> dict[int, str]:
    """Entries (>= start) followed by hidden messages -> the volatile blocks they keep ("" = none): the first
    group after an entry holds them."""
    frozen: dict[int, str] = {}
    for g in hidden:
        if g.after >= start and g.after not in frozen:
            frozen[g.after] = g.volatile
    return frozen


def entry_position(entry: int, start: int, hidden: Sequence[HiddenGroup], system_count: int) -> int:
    """Index in the upstream messages at which entry `entry` is rendered (entries >= start)."""
    shift = sum(len(g.messages) for g in hidden if start <= g.after < entry)
    return system_count + (entry - start) + shift
