"""Prompt layout (DESIGN 5): the client's system message (B1) alone first, so that it and the tools a chat template
renders after it stay a byte-identical prefix across epochs; the proxy's blocks that change at epochs (B2a profile,
B4 summary and contents page) lead the first active message (B6, verbatim otherwise); volatile blocks in the last
user message."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from .condense import condense_message, condense_messages
from .markup import escape_tags, quote
from .memo import memoised
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
    """B1 + B2a (profile) + B4 (summary, contents page): what the prompt holds of them (their tokens, and what
    changed); None when all are empty. The profile and summary are model-written from client text: quoted
    (memci_proxy.engine.markup)."""
    parts = [b1, memory_block(profile, summary, contents)]
    text = "\n\n".join(p for p in parts if p)
    return text or None


def memory_text(profile: str, summary: str, contents: str) -> str:
    """B2a + B4 as the proxy renders them ("" when all are empty)."""
    parts = [quote(profile), "## Conversation summary\n" + quote(summary) if summary else "", contents]
    return "\n\n".join(p for p in parts if p)


def memory_block(profile: str, summary: str, contents: str) -> str:
    """B2a + B4 delimited as the proxy's own block, to lead the first active message ("" when all are empty).
    Remembered: every turn renders it; it changes at epochs."""
    return _memory_block((profile, summary, contents))


@memoised(256, 16 * 1024 * 1024)
def _memory_block(parts: tuple[str, str, str]) -> str:
    text = memory_text(*parts)
    return f"{VOLATILE_OPEN}\n{text}\n{VOLATILE_CLOSE}" if text else ""


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
    return with_blocks(message, "", block)


def with_blocks(message: dict[str, Any], before: str, after: str) -> dict[str, Any]:
    """A copy of the user message with the proxy's blocks before and after the client's text, in which look-alikes
    of the blocks' tags are escaped (the blocks the model reads in this message are the proxy's alone)."""
    content = message.get("content")
    lead = [{"type": "text", "text": before}] if before else []
    tail = [{"type": "text", "text": after}] if after else []
    if isinstance(content, list):
        parts = [
            {**p, "text": _escaped(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else p
            for p in content
        ]
        return {**message, "content": [*lead, *parts, *tail]}
    texts = [before, _escaped(content) if isinstance(content, str) else "", after]
    return {**message, "content": "\n\n".join(t for t in texts if t)}


_ESCAPED_CACHE_CHARS = 32_768


@memoised(1024, 32 * 1024 * 1024)
def _escaped_cached(text: str) -> str:
    return escape_tags(text)


def _escaped(text: str) -> str:
    """escape_tags, remembered for texts up to 32k characters: the message that carries the memory block does so
    every turn until the next epoch (at most 32 MB held)."""
    return _escaped_cached(text) if len(text) <= _ESCAPED_CACHE_CHARS else escape_tags(text)


def without_memory_block(message: dict[str, Any]) -> dict[str, Any]:
    """The message as the client sent it, when it carries the memory block at its start (a prompt's first active
    message): the block taken off (look-alikes of its tags in the client's text stay escaped)."""
    content = message.get("content")
    if isinstance(content, str) and content.startswith(VOLATILE_OPEN):
        end = content.find(VOLATILE_CLOSE)
        if end >= 0:
            return {**message, "content": content[end + len(VOLATILE_CLOSE):].removeprefix("\n\n")}
    elif isinstance(content, list) and content and isinstance(content[0], dict) and \
            str(content[0].get("text", "")).startswith(VOLATILE_OPEN):
        return {**message, "content": content[1:]}
    return message


def leads_in_place(message: dict[str, Any]) -> bool:
    """Whether the first active message can carry the memory block (a user message), else it gets one of its own."""
    return message.get("role") == "user"


def render_active(
    messages: Sequence[dict[str, Any]],
    start: int,
    condensed: Sequence[int],
    hidden: Sequence[HiddenGroup],
    tool_chars: int,
    volatile: Mapping[int, str],
    image_texts: Mapping[str, str] | None = None,
    previews: Mapping[int, dict[str, Any]] | None = None,
    lead: str = "",
) -> list[dict[str, Any]]:
    """B6: entries [start, len(messages)) verbatim, condensed where flagged (images decayed to `image_texts`
    when given), offloaded ones by their `previews`, hidden groups spliced in place, volatile blocks appended to
    the entries `volatile` maps; `lead` (the memory block) before the first entry's text when it is a user
    message, else as a user message of its own before it (`leads_in_place`)."""
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
    if lead and start < len(messages):
        if leads_in_place(messages[start]):
            points.add(start)
        else:
            out.append({"role": "user", "content": lead})
            lead = ""
    elif lead:
        out.append({"role": "user", "content": lead})
        lead = ""
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
        before = lead if p == start else ""
        if block or before:
            msg = with_blocks(msg, before, block or "")
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
