"""Archived pages as text: what a recall by page number returns, and what the search indexes."""

from __future__ import annotations

from typing import Any

from proxy.engine.contents import utc_date


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif part.get("type") == "image_url":
                    parts.append("[image]")
        return "\n".join(parts)
    return ""


def message_text(message: dict[str, Any]) -> str:
    """One message as role-labelled text (tool calls spelled out)."""
    role = str(message.get("role", "?"))
    text = content_text(message.get("content"))
    lines = [f"{role}: {text}"] if text else []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        lines.append(f"{role} called {fn.get('name', '?')}({fn.get('arguments', '')})")
    if role == "tool" and not text:
        lines.append("tool: (empty result)")
    return "\n".join(lines) if lines else f"{role}: (empty)"


def page_messages_with_hidden(
    messages: list[dict[str, Any]], start: int, hidden: list[tuple[int, list[dict[str, Any]]]]
) -> list[dict[str, Any]]:
    """The page's messages in order, hidden messages spliced after the entries they follow."""
    after: dict[int, list[dict[str, Any]]] = {}
    for index, group in hidden:
        after.setdefault(index, []).extend(group)
    out: list[dict[str, Any]] = []
    for offset, message in enumerate(messages):
        out.append(message)
        out.extend(after.get(start + offset, ()))
    return out


def render_page(label: str, first_seen: float, status: str, messages: list[dict[str, Any]]) -> str:
    header = f"[Page {label}] {utc_date(first_seen)}, {len(messages)} message{'s' if len(messages) != 1 else ''} ({status})"
    return header + "\n" + "\n".join(message_text(m) for m in messages)


def index_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(message_text(m) for m in messages)


def excerpt(text: str, terms: list[str], limit: int = 300) -> str:
    """About `limit` characters of `text` around the first place a query term occurs."""
    flat = " ".join(text.split())
    lower = flat.lower()
    positions = [lower.find(t) for t in terms if t and lower.find(t) >= 0]
    start = max(0, min(positions) - limit // 3) if positions else 0
    piece = flat[start : start + limit]
    return ("…" if start > 0 else "") + piece + ("…" if start + limit < len(flat) else "")
