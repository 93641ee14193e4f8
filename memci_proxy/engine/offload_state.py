"""First-sight offload in the conversation state: new entries offloaded as they arrive, the previews of the active
ones for the prompt, and the previews restored to the full text when a request asks for it (offload off)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import msgspec

from .condense import condense_message
from .output_preview import (
    DOCUMENT, OffloadLimits, OffloadRecord, offload_kind, output_text, preview_chars_for, preview_message, split_lines,
)
from .state import ARCHIVED, HASH_SIZE, ConversationState, PageRecord, normalise_label
from .tokens import TokenCounter

replace = msgspec.structs.replace


def offload_on_arrival(
    s: ConversationState, index: int, message: dict[str, Any], tokens: int, digest: bytes, limits: OffloadLimits,
    counter: TokenCounter,
) -> OffloadRecord | None:
    """Offload entry `index` (just appended with `tokens`, its full count) when it is over its threshold: it gets
    the next page number, and its tokens in the state become its preview's. In place; the record, or None."""
    kind = offload_kind(message, limits)
    if kind is None or tokens <= kind[1]:
        return None
    text = output_text(message)
    if not text:
        return None
    chars = preview_chars_for(text, tokens, limits.preview_tokens)
    record = OffloadRecord(s.next_page, index, len(split_lines(text)), len(text), tokens, chars, kind[0])
    shown = counter.count_message(preview_message(message, record, digest))
    if shown >= tokens:
        return None  # nothing to gain (a text of very long lines, say): kept as it is
    s.next_page += 1
    s.offloads.append(record)
    _set_tokens(s, index, shown)
    return record


def _set_tokens(s: ConversationState, entry: int, tokens: int) -> None:
    """Entry `entry` of the open or an active page is rendered with `tokens` from now on."""
    delta = tokens - s.tokens[entry]
    if not delta:
        return
    s.tokens[entry] = tokens
    for pi in range(len(s.pages) - 1, -1, -1):
        record = s.pages[pi]
        if record.start <= entry < record.end:
            s.pages[pi] = replace(record, tokens=record.tokens + delta)
            if pi >= s.first_active_page:
                s.active_tokens += delta
            return


def _first_at(s: ConversationState, entry: int) -> int:
    """Index of the first record of an entry >= `entry` (records are in entry order)."""
    return bisect.bisect_left(s.offloads, entry, key=lambda r: r.entry)


def _condensed(s: ConversationState, entry: int) -> bool:
    at = bisect.bisect_left(s.condensed, entry)
    return at < len(s.condensed) and s.condensed[at] == entry


def entry_digest_of(s: ConversationState, entry: int) -> bytes:
    return s.hash_blob[entry * HASH_SIZE : (entry + 1) * HASH_SIZE]


def active_previews(
    s: ConversationState, messages: Sequence[dict[str, Any]], start: int, condense_chars: int
) -> dict[int, dict[str, Any]]:
    """Entry -> the message prompts carry for each offloaded entry of the active chapter (its preview, or its stub
    once condensed)."""
    out: dict[int, dict[str, Any]] = {}
    for record in s.offloads[_first_at(s, start):]:
        if record.entry < len(messages):
            out[record.entry] = preview_message(messages[record.entry], record, entry_digest_of(s, record.entry),
                                                _condensed(s, record.entry), condense_chars)
    return out


def restore_active(
    s: ConversationState, messages: Sequence[dict[str, Any]], counter: TokenCounter, condense_chars: int
) -> list[int]:
    """Offload off for this request: the active offloaded entries go back to their full text (condensed ones to the
    condensed text) and stop being offloaded; archived ones stay pages of their own. In place; the entries."""
    at = _first_at(s, s.active_start_entry())
    if at == len(s.offloads):
        return []
    restored: list[int] = []
    kept: list[OffloadRecord] = s.offloads[:at]
    for record in s.offloads[at:]:
        if record.entry >= len(messages):
            kept.append(record)
            continue
        message = messages[record.entry]
        if _condensed(s, record.entry):
            shown = condense_message(message, condense_chars)
            tokens = counter.count_message(shown) if shown is not None else record.tokens
        else:
            tokens = record.tokens
        _set_tokens(s, record.entry, tokens)
        restored.append(record.entry)
    s.offloads = kept
    return restored


def condensed_offload(
    s: ConversationState, messages: Sequence[dict[str, Any]], entry: int, condense_chars: int
) -> dict[str, Any] | None:
    """The condensed form of an offloaded entry (its stub), or None when the entry is not offloaded."""
    at = _first_at(s, entry)
    if at < len(s.offloads) and s.offloads[at].entry == entry:
        record = s.offloads[at]
        return preview_message(messages[entry], record, entry_digest_of(s, entry), True, condense_chars)
    return None


def find_offload(state: ConversationState, page: int | str | float) -> OffloadRecord | None:
    """The offloaded output of a page label ("17", "#17", 17), or None."""
    try:
        label = normalise_label(page)
    except ValueError:
        return None
    for record in state.offloads:
        if record.label == label:
            return record
    return None


def offload_page(state: ConversationState, page: int | str | float) -> PageRecord | None:
    """An offloaded output as a page record of its own (archived: out of the prompt but for its preview), for the
    searches and the views that list pages: its entry alone, dated as the page that holds it. None: not one."""
    record = find_offload(state, page)
    if record is None:
        return None
    holder = next((p for p in reversed(state.pages) if p.start <= record.entry < p.end), None)
    return PageRecord(record.number, 1, record.entry, record.entry + 1, record.tokens, ARCHIVED,
                      has_user=record.kind == DOCUMENT, first_seen=holder.first_seen if holder is not None else 0.0)
