"""First-sight offload, the preview: a huge tool output (or pasted document) becomes its own archived page when it arrives.

From the turn it arrives on, every prompt carries a stable preview in its place: the same bytes on every turn (a
pure function of the message, its page number and the preview size), holding the output's head and tail, the lines
that look like errors, its size, and how to read the rest through the recall tool (a line range, or a search
inside it). The full text stays in the client's history and in the store (the entry); nothing is cut for good.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from .markup import quote
from .memo import SizedMemo

TOOL = "tool"
DOCUMENT = "document"
# Most of a preview goes to the tail (where build and test output ends), then lines that look like errors, then
# the head (where a file or a log starts, and where agents put what they will do next).
HEAD_SHARE = 0.30
ERROR_SHARE = 0.30
LINE_CHARS = 240  # a line longer than this is cut in the preview (recall reads it whole)
LONG_LINE_CHARS = 8000  # an output with a line longer than this is read by characters (recall's `chars`)
_ERROR = re.compile(
    r"traceback \(most recent call|\berror\b|\berr!|\bexception\b|\bfailed\b|\bfailure\b|\bfatal\b|\bpanic\b"
    r"|\bsegmentation fault\b|^e {2,}|^\s*fail\b",
    re.IGNORECASE,
)


class OffloadRecord(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Entry `entry` (a tool result or a user message) stored as page `number`; it holds `lines` lines and `chars`
    characters of text, `tokens` tokens in full, and is shown by a preview of about `preview_chars` characters."""

    number: int
    entry: int
    lines: int
    chars: int
    tokens: int
    preview_chars: int
    kind: str = TOOL

    @property
    def label(self) -> str:
        return str(self.number)


@dataclass(frozen=True)
class OffloadLimits:
    """Tokens above which a tool output / a user message is offloaded (0: never), and the preview's size."""

    tool_tokens: int
    document_tokens: int
    preview_tokens: int


def output_text(message: dict[str, Any]) -> str | None:
    """The text of a message that may be offloaded: string content, or content made of text parts only."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for part in content:
            if not (isinstance(part, dict) and isinstance(part.get("text"), str)):
                return None  # an image or another part: kept as it is
            texts.append(part["text"])
        return "".join(texts)
    return None


def split_lines(text: str) -> list[str]:
    """The output's lines (1-based for the model): split at "\\n", a final newline opening no line. Joining a range
    with "\\n" gives its text back byte for byte."""
    lines = text.split("\n")
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def offload_kind(message: dict[str, Any], limits: OffloadLimits) -> tuple[str, int] | None:
    """(kind, threshold) for a message that may be offloaded, else None."""
    role = message.get("role")
    if role == "tool" and limits.tool_tokens > 0:
        return TOOL, limits.tool_tokens
    if role == "user" and limits.document_tokens > 0:
        return DOCUMENT, limits.document_tokens
    return None


def _fit(line: str) -> str:
    """One line of the output as the preview shows it: cut, then quoted (memci_proxy.engine.markup): the preview is the
    proxy's block, and a line that looks like a page header or a tag of the proxy's must not read as one."""
    return quote(line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + f"…[+{len(line) - LINE_CHARS} chars]")


def _cost(line: str) -> int:
    return min(len(line), LINE_CHARS + 16) + 1


def _take(lines: Sequence[str], indices: Sequence[int], room: float, extra: int = 0) -> tuple[list[int], float]:
    """Lines of `indices`, in that order, while they fit in `room` characters (`extra`: each one's markers)."""
    taken: list[int] = []
    for i in indices:
        cost = _cost(lines[i]) + extra
        if cost > room:
            break
        taken.append(i)
        room -= cost
    return taken, room


def _alternate(indices: list[int]) -> list[int]:
    """First, last, second, second last, ...: the first error is often the cause, the last the outcome."""
    out: list[int] = []
    low, high = 0, len(indices) - 1
    while low <= high:
        out.append(indices[low])
        if high != low:
            out.append(indices[high])
        low, high = low + 1, high - 1
    return out


def _number(n: int) -> str:
    return f"{n:,}"


def build_preview(text: str, number: int, kind: str, chars: int, tokens: int) -> str:
    """The preview of an offloaded text within about `chars` characters. Deterministic: the same arguments give
    the same bytes."""
    lines = split_lines(text)
    total = len(lines)
    room = float(max(200, chars))
    head, left = _take(lines, range(total), room * HEAD_SHARE)
    room -= room * HEAD_SHARE - left
    head_end = head[-1] + 1 if head else 0
    errors = [i for i in range(head_end, total) if _ERROR.search(lines[i])]
    error_room = room * ERROR_SHARE / (1 - HEAD_SHARE) if errors else 0.0
    tail, left = _take(lines, range(total - 1, head_end - 1, -1), room - error_room - 40)
    if not tail and total > head_end:
        tail = [total - 1]  # the last line always (where build and test output ends)
    tail_start = tail[-1] if tail else total
    shown_errors = sorted(_take(lines, _alternate([i for i in errors if i < tail_start]), error_room + left, 48)[0])
    label = "Tool output" if kind == TOOL else "Pasted document"
    what = f"{_number(total)} lines, {_number(len(text))} characters (~{_number(tokens)} tokens)"
    first_hidden = head_end + 1
    longest = max(len(line) for line in lines)
    if longest > LONG_LINE_CHARS:  # JSON on one line, a minified file: read by characters
        read = (f"page={number} and chars=\"{LINE_CHARS + 1}-{min(len(text), LINE_CHARS + LONG_LINE_CHARS)}\" (its "
                f"longest line has {_number(longest)} characters)")
    else:
        read = f"page={number} and lines=\"{first_hidden}-{min(total, first_hidden + 59)}\""
    out = [
        f"[{label} stored in full as page {number}: {what}. Shown: its first and last lines"
        + (" and lines that look like errors" if shown_errors else "")
        + f". Read the rest with recall: {read}, or page={number} and query=\"...\" to search within it.]"
    ]
    out.extend(_fit(lines[i]) for i in head)
    cursor = head_end
    for i in shown_errors:
        if i > cursor:
            out.append(f"[… lines {_number(cursor + 1)}-{_number(i)} not shown …]")
        out.append(f"[line {_number(i + 1)}] " + _fit(lines[i]))
        cursor = i + 1
    if tail_start > cursor:
        out.append(f"[… lines {_number(cursor + 1)}-{_number(tail_start)} not shown …]")
    out.extend(_fit(lines[i]) for i in range(max(tail_start, cursor), total))
    if len(lines[-1]) > LINE_CHARS:  # shown cut: where a one-line output (or its last line) ends
        out.append(f"[… its last {LINE_CHARS} characters:] {lines[-1][-LINE_CHARS:]}")
    return "\n".join(out)


def stub_text(record: OffloadRecord, head: str, chars: int) -> str:
    """What an offloaded output condenses to at an epoch: where it is, and the start of its first line."""
    label = "Tool output" if record.kind == TOOL else "Pasted document"
    first = quote(head[:chars] + ("…" if len(head) > chars else ""))
    return (f"[{label} stored as page {record.number} ({_number(record.lines)} lines); read it with recall "
            f"page={record.number} and lines=\"a-b\" or query=\"...\".] {first}")


# Previews of this process, keyed by the entry's digest and what shapes the preview: a preview is rendered on every
# turn while its entry is active, and computing it reads the whole output.
_PREVIEWS: SizedMemo[tuple[bytes, int, int, bool, int], str] = SizedMemo(2048, 16 * 1024 * 1024)


def preview_message(
    message: dict[str, Any], record: OffloadRecord, digest: bytes, condensed: bool = False, condense_chars: int = 200,
) -> dict[str, Any]:
    """The message as prompts carry it: its content replaced by the preview (or, condensed, by the stub)."""
    key = (digest, record.number, record.preview_chars, condensed, condense_chars)
    text = _PREVIEWS.get(key)
    if text is None:
        full = output_text(message) or ""
        if condensed:
            text = stub_text(record, full.split("\n", 1)[0], condense_chars)
        else:
            text = build_preview(full, record.number, record.kind, record.preview_chars, record.tokens)
        _PREVIEWS.put(key, text)
    out = {k: v for k, v in message.items() if k != "content"}
    out["content"] = text
    return out


def preview_chars_for(text: str, tokens: int, preview_tokens: int) -> int:
    """Characters of preview for about `preview_tokens` tokens, at the text's own characters per token."""
    per_token = len(text) / max(1, tokens)
    return max(200, int(preview_tokens * min(4.0, max(1.0, per_token))))
