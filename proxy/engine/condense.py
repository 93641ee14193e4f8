"""Seed 003 tier 2 condenser: drop reasoning, cut long tool outputs. Returns new dicts, never mutates."""

from __future__ import annotations

from typing import Any

REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
THINKING_PART_TYPES = ("thinking", "reasoning", "redacted_thinking")


def cut_marker(removed: int) -> str:
    return f"…[cut {removed} chars]"


def _cut_text(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + cut_marker(len(text) - limit)


def condense_message(message: dict[str, Any], tool_chars: int) -> dict[str, Any] | None:
    """The condensed form of a message, or None when condensing would not change it."""
    role = message.get("role")
    if role == "tool":
        content = message.get("content")
        if isinstance(content, str):
            if len(content) <= tool_chars:
                return None
            return {**message, "content": _cut_text(content, tool_chars)}
        if isinstance(content, list):
            text = "".join(
                p.get("text", "") if isinstance(p, dict) and isinstance(p.get("text"), str) else "" for p in content
            )
            has_other = any(not (isinstance(p, dict) and isinstance(p.get("text"), str)) for p in content)
            if len(text) <= tool_chars and not has_other:
                return None
            return {**message, "content": _cut_text(text, tool_chars)}
        return None
    if role == "assistant":
        changed = False
        out = dict(message)
        for key in REASONING_KEYS:
            if key in out:
                del out[key]
                changed = True
        content = out.get("content")
        if isinstance(content, list):
            kept = [p for p in content if not (isinstance(p, dict) and p.get("type") in THINKING_PART_TYPES)]
            if len(kept) != len(content):
                out["content"] = kept
                changed = True
        return out if changed else None
    return None


def condense_messages(messages: list[dict[str, Any]], tool_chars: int) -> tuple[list[dict[str, Any]], bool]:
    out: list[dict[str, Any]] = []
    changed = False
    for m in messages:
        c = condense_message(m, tool_chars)
        if c is None:
            out.append(m)
        else:
            out.append(c)
            changed = True
    return out, changed
