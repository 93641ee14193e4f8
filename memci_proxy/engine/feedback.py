"""State updates from outside a plan: upstream usage, hidden messages, recalls."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

import msgspec

from .state import ACTIVE, ConversationState, HiddenGroup, find_page
from .tokens import EstimateCounter, TokenCounter

replace = msgspec.structs.replace

RATIO_SMOOTHING = 0.3
RATIO_MIN = 0.25
RATIO_MAX = 4.0


def observe_usage(
    state: ConversationState, prompt_tokens: int, cached_tokens: int | None, estimated_tokens: int, now: float,
    floor: float = RATIO_MIN,
) -> ConversationState:
    """Learn the estimate's correction ratio (smoothed) and remember what the upstream had cached.

    `estimated_tokens` is the `Plan.estimated_tokens` of the request the usage belongs to. The ratio only
    moves epochs; it never changes the rendering between them. `floor`: the least ratio (1.0 when the counts
    are already learned from the upstream with a safety margin: the ratio may raise them, never lower them).
    """
    ratio = state.correction_ratio
    floor = min(RATIO_MAX, max(RATIO_MIN, floor))
    if prompt_tokens > 0 and estimated_tokens > 0 and ratio > 0:
        raw = estimated_tokens / ratio
        observed = min(RATIO_MAX, max(floor, prompt_tokens / raw))
        ratio = min(RATIO_MAX, max(floor, ratio + RATIO_SMOOTHING * (observed - ratio)))
    return replace(
        state,
        correction_ratio=ratio,
        last_cached_tokens=None if cached_tokens is None else int(cached_tokens),
        last_turn_time=now,
    )


def add_hidden(
    state: ConversationState,
    after_entry_index: int,
    messages: list[dict[str, Any]],
    counter: TokenCounter | None = None,
) -> ConversationState:
    """Messages the client never sent (a resolved recall exchange), rendered after the given entry from now on.

    They belong to the page of that entry, count toward the budget and leave the state when their page is
    archived (the caller stores them with the page's messages).
    """
    if not 0 <= after_entry_index < state.entry_count:
        raise IndexError(f"no entry {after_entry_index} (the conversation has {state.entry_count})")
    if not messages:
        return state
    counter = counter or EstimateCounter()
    tokens = sum(counter.count_message(m) for m in messages)
    s = state.copy()
    volatile = ""
    if after_entry_index == s.last_volatile_entry and not any(g.after == after_entry_index for g in s.hidden):
        # The user message these messages answer keeps the volatile blocks the upstream saw with them.
        volatile = s.last_volatile_text
        tokens += counter.count_text(volatile) if volatile else 0
    group = HiddenGroup(after_entry_index, [dict(m) for m in messages], tokens, added_turn=s.turn, volatile=volatile)
    position = bisect.bisect_right([g.after for g in s.hidden], after_entry_index)
    s.hidden.insert(position, group)
    for pi in range(len(s.pages) - 1, -1, -1):
        record = s.pages[pi]
        if record.start <= after_entry_index < record.end:
            s.pages[pi] = replace(record, tokens=record.tokens + tokens)
            if record.status == ACTIVE and pi >= s.first_active_page:
                s.active_tokens += tokens
            break
    return s


def record_recall(
    state: ConversationState, page_numbers: Iterable[int | str | float], turn: int | None = None
) -> ConversationState:
    """Count a recall of each page (eviction input). `turn` defaults to the state's current turn."""
    s = state.copy()
    when = s.turn if turn is None else turn
    for page in page_numbers:
        pi = find_page(s, page)
        if pi is None:
            continue
        record = s.pages[pi]
        s.pages[pi] = replace(record, recall_count=record.recall_count + 1, last_recalled_turn=when)
    return s
