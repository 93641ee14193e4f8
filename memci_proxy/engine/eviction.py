"""Seed 000 eviction of contents entries: m rounds never recalled, p rounds unchanged, LRU over size."""

from __future__ import annotations

from .state import ARCHIVED, PageRecord

RULE_UNRECALLED = "unrecalled"
RULE_UNCHANGED = "unchanged"
RULE_LRU = "lru"


def rule_evictions(
    pages: list[PageRecord], turn: int, unrecalled_after: int, unchanged_after: int
) -> list[tuple[int, str]]:
    """(index into pages, rule) of archived pages the round-count rules evict."""
    out: list[tuple[int, str]] = []
    for index, p in enumerate(pages):
        if p.status != ARCHIVED:
            continue
        if p.recall_count == 0 and turn - p.archived_turn >= unrecalled_after:
            out.append((index, RULE_UNRECALLED))
        elif p.recall_count > 0 and turn - max(p.archived_turn, p.last_recalled_turn) >= unchanged_after:
            out.append((index, RULE_UNCHANGED))
    return out


def lru_order(pages: list[PageRecord]) -> list[int]:
    """Archived pages, least recently used (recalled, else archived) first; ties by position."""
    candidates = [i for i, p in enumerate(pages) if p.status == ARCHIVED]
    return sorted(candidates, key=lambda i: (max(pages[i].archived_turn, pages[i].last_recalled_turn), i))


def lru_evictions(pages: list[PageRecord], contents_tokens: int, header_tokens: int, max_tokens: int) -> list[int]:
    """Indices to evict, LRU first, until the contents page fits in `max_tokens`."""
    out: list[int] = []
    total = contents_tokens
    for index in lru_order(pages):
        if total <= max_tokens:
            break
        out.append(index)
        total -= pages[index].contents_tokens
        if total <= header_tokens:
            total = 0
    return out
