"""The contents page: one entry per archived page, one extractive line per message. Deterministic text."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

from .condense import image_reference, image_text, message_images
from .markup import quote
from .state import ARCHIVED, PageRecord


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(1, limit - 1)].rstrip() + "…"


def _content_text(content: Any, skip_images: bool = False) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces: list[str] = []
        for part in content:
            if skip_images and image_reference(part) is not None:
                continue
            if isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    if part.get("type") not in ("thinking", "reasoning"):
                        pieces.append(part["text"])
                elif part.get("type"):
                    pieces.append(f"[{part['type']}]")
            elif isinstance(part, str):
                pieces.append(part)
        return " ".join(pieces)
    return ""


def _call_text(call: Any, limit: int) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return "called a tool"
    return f"called {_one_line(str(fn.get('name') or '?'))}({_one_line(str(fn.get('arguments') or '')[: 8 * limit])})"


def summary_line(message: dict[str, Any], limit: int, image_descriptions: Mapping[str, str] | None = None) -> str:
    """`role: text` cut to `limit` characters; tool calls as `called name(args)`. With `image_descriptions`
    images show as `[image: <description>]` after the first third of the text (the description is the recall
    anchor of a screenshot), else as `[image_url]` in place. Everything in the line but its shape comes from the
    client (text, tool names, arguments, a tool message's name, descriptions of its images): the line is quoted
    as a whole, last (memci_proxy.engine.markup)."""
    role = str(message.get("role") or "?")
    images = message_images(message) if image_descriptions is not None else []
    text = _one_line(_content_text(message.get("content"), skip_images=bool(images))[: 8 * limit])
    if images:
        described = " ".join(image_text(ref, image_descriptions, with_reference=False) for ref in images)
        text = f"{_cut(text, max(8, limit // 3))} {described}" if text else described  # only the start can show
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        called = "; ".join(_call_text(c, limit) for c in calls)
        text = f"{text} | {called}" if text else called
    if role == "tool" and message.get("name"):
        role = f"tool {_one_line(str(message['name'])[: 8 * limit])}"
    return quote(_cut(f"{role}: {text or '(empty)'}", limit))


def page_entry_body(
    messages: Sequence[dict[str, Any]], limit: int, image_descriptions: Mapping[str, str] | None = None
) -> str:
    """The per-message lines of one contents entry (stored with the page when it is archived)."""
    return "\n".join("  - " + summary_line(m, limit, image_descriptions) for m in messages)


def utc_day(timestamp: float) -> _dt.date:
    """The UTC day of a Unix timestamp (the day the contents page shows for a page)."""
    return _dt.datetime.fromtimestamp(timestamp, tz=_dt.timezone.utc).date()


def utc_date(timestamp: float) -> str:
    return utc_day(timestamp).isoformat()


def entry_header(record: PageRecord) -> str:
    count = record.end - record.start
    header = f"[Page {record.label}] {utc_date(record.first_seen)}, {count} message{'s' if count != 1 else ''}"
    if record.recall_count:
        header += f", recalled {record.recall_count}x"
    return header


def contents_intro(recall_tool: str | None) -> str:
    intro = (
        "## Contents of archived pages\n"
        "Earlier parts of this conversation were archived into numbered pages that are no longer shown "
        "in full. Each entry gives the page number, date, message count and one line per message."
    )
    if recall_tool:
        intro += (
            f' To read pages in full, call the `{recall_tool}` tool with their numbers, e.g. {{"pages": [3, "12.2"]}}.'
        )
    return intro


def render_contents(pages: Sequence[PageRecord], recall_tool: str | None) -> str:
    """The whole contents page for the archived (not evicted) pages, oldest first; empty when none."""
    entries = [f"{entry_header(p)}\n{p.contents}" for p in pages if p.status == ARCHIVED]
    if not entries:
        return ""
    return contents_intro(recall_tool) + "\n\n" + "\n".join(entries)
