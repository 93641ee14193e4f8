"""`memci-proxy inspect <conversation>`: the conversation's last upstream prompt, read from the admin API
(`GET /memci/conversations/{id}/prompt`), printed with its blocks coloured in the terminal (ANSI; plain text
with --no-color, and when stdout is not a terminal). Each message is headed by its index, role and block; the
leading system message is split into B1 (the client's system prompt), B2a (profile) and B4 (summary and
contents page), and the proxy's per-turn `<memci-context>` block is marked inside the latest user message.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from memci_proxy.engine.layout import VOLATILE_CLOSE as CONTEXT_CLOSE
from memci_proxy.engine.layout import VOLATILE_OPEN as CONTEXT_OPEN
from memci_proxy.engine.state import STATUS_MEANINGS
from memci_proxy.turn.shapes import call_id, recall_calls

RESET = "\x1b[0m"
COLORS = {
    "B1": "\x1b[34m",  # blue: the client's system prompt, verbatim
    "B2a": "\x1b[35m",  # magenta: profile
    "B4": "\x1b[36m",  # cyan: summary and contents page
    "B6": "",  # the active pages, verbatim: plain
    "recall": "\x1b[32m",  # green: recall exchanges spliced back into B6
    "context": "\x1b[33m",  # yellow: the per-turn block (B3 task state, B2b intent, B5 memory)
    "head": "\x1b[1m",
    "dim": "\x1b[2m",
}
LEGEND = ("B1 client system prompt", "B2a profile", "B4 summary + contents page", "B6 active pages verbatim",
          "recall exchanges", "context: per-turn block (B3/B2b/B5)")


class InspectError(Exception):
    pass


def fetch_prompt(url: str, conversation: str, admin_key: str, timeout: float = 10.0) -> dict[str, Any]:
    """The admin API's view of the conversation's last upstream prompt (raises InspectError with its message)."""
    endpoint = f"{url.rstrip('/')}/memci/conversations/{conversation}/prompt"
    try:
        response = httpx.get(endpoint, headers={"Authorization": f"Bearer {admin_key}"}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise InspectError(f"{endpoint}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        raise InspectError(f"{endpoint}: HTTP {response.status_code}: {message}")
    return response.json()


def paint(text: str, block: str, color: bool) -> str:
    code = COLORS.get(block, "")
    return f"{code}{text}{RESET}" if color and code and text else text


def content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict):
                parts.append(f"[{part.get('type', 'part')}]")
        text = "\n".join(parts)
    else:
        text = ""
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        text += f"\n-> {function.get('name')}({function.get('arguments', '')})"
    return text


def block_of(index: int, blocks: list[dict[str, Any]]) -> str:
    names = [b["name"] for b in blocks if b["start"] <= index < b["end"] and "chars" not in b]
    for preferred in ("tail", "B4", "B6"):
        if preferred in names:
            return preferred
    return names[0] if names else "B6"


def page_summary(pages: list[dict[str, Any]]) -> str:
    """``3 active, 28 archived (1 on the contents page, 27 evicted)``: the numbers of the X-Memci-Pages-* headers."""
    counts = {name: sum(1 for page in pages if page.get("state") == name) for name in STATUS_MEANINGS}
    archived = counts["archived"] + counts["evicted"]
    return (f"{counts['active']} active, {archived} archived "
            f"({counts['archived']} on the contents page, {counts['evicted']} evicted)")


def render(view: dict[str, Any], color: bool = True, recall_tool: str = "recall") -> str:
    messages = view.get("messages") or []
    blocks = view.get("blocks") or []
    epoch = view.get("epoch")  # the admin API: whether that turn was a compaction epoch
    said = "  (a compaction epoch)" if epoch is True else "" if epoch in (False, None) else f"  epoch {epoch}"
    out = [paint(f"conversation {view.get('conversation_id')}{said}  {len(messages)} messages upstream", "head",
                 color)]
    pages = view.get("pages") or []
    if pages:  # counted as the X-Memci-Pages-* headers count (archived: every page out of the prompt)
        out.append(paint("pages: " + page_summary(pages), "dim", color))
        for name in ("archived", "evicted"):
            if any(page.get("state") == name for page in pages):
                out.append(paint(f"  {name}: {STATUS_MEANINGS[name]}", "dim", color))
    accounting = view.get("accounting") or {}
    if accounting.get("max_tokens_sent") is not None:  # the answer's room: what the request asked, what was sent
        asked, sent = accounting.get("max_tokens_asked"), accounting["max_tokens_sent"]
        lowered = f" (lowered from {asked:,} to fit the window)" if isinstance(asked, int) and asked > sent else ""
        out.append(paint(f"answer: max_tokens {sent:,}{lowered}", "dim", color))
    out.append("legend: " + "  ".join(paint(text, text.split()[0].rstrip(":"), color) for text in LEGEND))
    recall_ids: set[str] = set()
    for index, message in enumerate(messages):
        role = message.get("role", "?")
        text = content_text(message)
        char_blocks = [b for b in blocks if "chars" in b and b["start"] <= index < b["end"]]
        if char_blocks:  # the leading system message: B1, B2a, B4 by character ranges
            out.append(paint(f"[{index}] {role}  " + " + ".join(b["name"] for b in char_blocks), "head", color))
            raw = message.get("content") if isinstance(message.get("content"), str) else text
            position = 0
            for b in sorted(char_blocks, key=lambda b: b["chars"][0]):
                start, end = b["chars"]
                if start > position:
                    out.append(paint(raw[position:start], "B1", color))
                out.append(paint(raw[start:end], b["name"], color))
                position = max(position, end)
            if position < len(raw):
                out.append(raw[position:])
            continue
        block = block_of(index, blocks)
        calls = recall_calls(message, recall_tool)
        recall_ids |= {i for c in calls if (i := call_id(c.get("id"))) is not None}
        is_recall = bool(calls) or (role == "tool" and call_id(message.get("tool_call_id")) in recall_ids)
        label = "recall" if is_recall else ("context" if block == "tail" else block)
        shown_block = "B6 + context" if block == "tail" else ("B6 recall" if is_recall else block)
        out.append(paint(f"[{index}] {role}  {shown_block}", "head", color))
        if block == "tail" and CONTEXT_OPEN in text:
            before, _, rest = text.partition(CONTEXT_OPEN)
            inside, _, after = rest.partition(CONTEXT_CLOSE)
            out.append(before + paint(CONTEXT_OPEN + inside + CONTEXT_CLOSE, "context", color) + after)
        else:
            out.append(paint(text, "recall" if is_recall else ("B6" if label == "context" else label), color))
    return "\n".join(out) + "\n"


def render_json(view: dict[str, Any]) -> str:
    return json.dumps(view, ensure_ascii=False, indent=2) + "\n"
