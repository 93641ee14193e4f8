"""The pages to show beside a search hit (pure): the parts of one user turn that a long agent loop split.

A page larger than ``page_max_tokens`` is cut into continuation pages (``12``, ``12.2``, ``12.3``): only the first
holds the user's message, and a tool result may be answered on the next part. So a hit on a continuation page
brings the part before it (where the question is), and a hit whose match sits in its last message brings the part
that continues it (the caller decides where the match sits). Only pages out of the prompt (archived or evicted)
are brought: active ones are in it already.
"""

from __future__ import annotations

from memci_proxy.engine.state import ACTIVE, ConversationState, find_page, page_label

__all__ = ["part_before", "part_after"]


def _out_of_prompt(state: ConversationState, number: int, part: int) -> str | None:
    label = page_label(number, part)
    position = find_page(state, label)
    return label if position is not None and state.pages[position].status != ACTIVE else None


def part_before(state: ConversationState, label: str) -> str | None:
    """The part before continuation page ``label`` (``12`` for ``12.2``), or None (a first part, or not archived)."""
    position = find_page(state, label)
    if position is None or state.pages[position].part == 1:
        return None
    record = state.pages[position]
    return _out_of_prompt(state, record.number, record.part - 1)


def part_after(state: ConversationState, label: str) -> str | None:
    """The part that continues page ``label`` (``12.2`` for ``12``), or None (no such part, or not archived)."""
    position = find_page(state, label)
    if position is None:
        return None
    record = state.pages[position]
    return _out_of_prompt(state, record.number, record.part + 1)
