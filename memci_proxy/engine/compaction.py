"""A compaction epoch: condense old active pages, archive the oldest pages, evict contents entries,
condense the open page as a last resort. Works in place on a copied state."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .condense import condense_message, condense_messages
from .config import EngineConfig
from .contents import contents_intro, entry_header, page_entry_body
from .eviction import lru_evictions, rule_evictions
from .offload_state import condensed_offload
from .state import ARCHIVED, EVICTED, ConversationState
from .tokens import TokenCounter

replace = msgspec.structs.replace


@dataclass
class EpochResult:
    archived: list[str] = field(default_factory=list)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    condensed: int = 0
    first_condensed_entry: int | None = None


class _Budgeter:
    """Tracks the estimated prompt (raw tokens) while pages move between chapters."""

    def __init__(self, state: ConversationState, counter: TokenCounter, recall_tool: str | None, fixed: int) -> None:
        self.state = state
        self.intro_tokens = counter.count_text(contents_intro(recall_tool)) + 1
        self.contents = self._contents_tokens()
        # system tokens without the contents page, plus volatile blocks and tools
        self.base = state.system_tokens - self.contents + fixed

    def _contents_tokens(self) -> int:
        entries = [p.contents_tokens for p in self.state.pages if p.status == ARCHIVED]
        return self.intro_tokens + sum(entries) if entries else 0

    def refresh_contents(self) -> None:
        self.contents = self._contents_tokens()

    def add_entry(self, tokens: int) -> None:
        self.contents += tokens + (self.intro_tokens if self.contents == 0 else 0)

    def raw(self) -> int:
        return self.base + self.contents + self.state.active_tokens


def _condense_entry(
    s: ConversationState, messages: Sequence[dict[str, Any]], entry: int, page_index: int, cfg: EngineConfig,
    counter: TokenCounter, condensed_set: set[int], image_texts: Mapping[str, str] | None = None,
) -> bool:
    if entry in condensed_set:
        return False
    c = condensed_offload(s, messages, entry, cfg.condense_tool_chars) if s.offloads else None
    if c is None:
        c = condense_message(messages[entry], cfg.condense_tool_chars, image_texts)
    if c is None:
        return False
    new_tokens = counter.count_message(c)
    delta = new_tokens - s.tokens[entry]
    s.tokens[entry] = new_tokens
    record = s.pages[page_index]
    s.pages[page_index] = replace(record, tokens=record.tokens + delta)
    s.active_tokens += delta
    bisect.insort(s.condensed, entry)
    condensed_set.add(entry)
    return True


def _condense_hidden(s: ConversationState, page_index: int, cfg: EngineConfig, counter: TokenCounter) -> int:
    record = s.pages[page_index]
    count = 0
    for gi, g in enumerate(s.hidden):
        if g.condensed or not record.start <= g.after < record.end:
            continue
        out, changed = condense_messages(g.messages, cfg.condense_tool_chars)
        if not changed:
            continue
        new_tokens = sum(counter.count_message(m) for m in out) + (counter.count_text(g.volatile) if g.volatile else 0)
        delta = new_tokens - g.tokens
        s.hidden[gi] = replace(g, tokens=new_tokens, condensed=True)
        record = replace(record, tokens=record.tokens + delta)
        s.active_tokens += delta
        count += 1
    s.pages[page_index] = record
    return count


def run_epoch(
    s: ConversationState,
    messages: Sequence[dict[str, Any]],
    cfg: EngineConfig,
    counter: TokenCounter,
    fixed_tokens: int,
    ratio: float,
    target: float,
    contents_max_tokens: int,
    image_texts: Mapping[str, str] | None = None,
    last_resort_target: float | None = None,
) -> EpochResult:
    """Bring the estimated prompt (raw x ratio) under `target` tokens if the pages allow it. With
    `image_texts` (image key -> description), condensing decays images to their descriptions and the contents
    page describes them; without it images are kept as they are."""
    result = EpochResult()
    recall_tool = cfg.recall_tool_name if cfg.recall_enabled else None
    budgeter = _Budgeter(s, counter, recall_tool, fixed_tokens)
    condensed_set = set(s.condensed)
    last = len(s.pages) - 1

    def note_condensed(entry: int) -> None:
        result.condensed += 1
        if result.first_condensed_entry is None or entry < result.first_condensed_entry:
            result.first_condensed_entry = entry

    # 1. condense the active pages other than the newest few (seed 003 tier 2)
    for pi in range(s.first_active_page, max(s.first_active_page, last + 1 - max(1, cfg.condense_keep_pages))):
        record = s.pages[pi]
        for entry in range(record.start, record.end):
            if _condense_entry(s, messages, entry, pi, cfg, counter, condensed_set, image_texts):
                note_condensed(entry)
        hidden_count = _condense_hidden(s, pi, cfg, counter)
        if hidden_count:
            result.condensed += hidden_count
            start = s.pages[pi].start
            if result.first_condensed_entry is None or start < result.first_condensed_entry:
                result.first_condensed_entry = start

    # 2. archive the oldest active pages, never the open one. The contents page counts at most at its cap: LRU
    # eviction (step 3) keeps it there, so counting it whole would archive more pages than the target needs.
    def estimate_after_eviction() -> float:
        capped = min(budgeter.contents, max(contents_max_tokens, budgeter.intro_tokens))
        return (budgeter.base + capped + s.active_tokens) * ratio

    while estimate_after_eviction() > target and s.first_active_page < last:
        pi = s.first_active_page
        record = s.pages[pi]
        body = page_entry_body(messages[record.start : record.end], cfg.summary_line_chars, image_texts)
        archived = replace(record, status=ARCHIVED, archived_turn=s.turn, contents=body)
        archived = replace(archived, contents_tokens=counter.count_text(entry_header(archived) + "\n" + body) + 1)
        s.pages[pi] = archived
        # hidden messages leave the state with their page (the proxy keeps them with the page's messages)
        s.hidden = [g for g in s.hidden if not record.start <= g.after < record.end]
        s.active_tokens -= record.tokens
        s.first_active_page += 1
        budgeter.add_entry(archived.contents_tokens)
        result.archived.append(record.label)

    # 3. pending evictions: the round rules, then LRU while the contents page is too large
    for pi, rule in rule_evictions(s.pages, s.turn, cfg.evict_after_unrecalled, cfg.evict_after_unchanged):
        s.pages[pi] = replace(s.pages[pi], status=EVICTED, contents="", contents_tokens=0)
        result.evicted.append((s.pages[pi].label, rule))
    budgeter.refresh_contents()
    for pi in lru_evictions(s.pages, budgeter.contents, budgeter.intro_tokens, contents_max_tokens):
        s.pages[pi] = replace(s.pages[pi], status=EVICTED, contents="", contents_tokens=0)
        result.evicted.append((s.pages[pi].label, "lru"))
    budgeter.refresh_contents()

    # 4. last resort: condense the oldest messages of the still active pages (the open page included), only as far
    # as the prompt must shrink to fit (`last_resort_target`), and the newest tool results (after the last
    # assistant message: what the model is about to read) only when nothing else is left to condense.
    limit = target if last_resort_target is None else max(target, last_resort_target)
    newest = len(messages)
    while newest > 0 and messages[newest - 1].get("role") != "assistant":
        newest -= 1
    for protect in (True, False):
        if budgeter.raw() * ratio <= limit:
            break
        for pi in range(s.first_active_page, len(s.pages)):
            record = s.pages[pi]
            for entry in range(record.start, record.end):
                if budgeter.raw() * ratio <= limit:
                    break
                if protect and entry >= newest:
                    break
                if _condense_entry(s, messages, entry, pi, cfg, counter, condensed_set, image_texts):
                    note_condensed(entry)
            if budgeter.raw() * ratio <= limit:
                break
            hidden_count = _condense_hidden(s, pi, cfg, counter)
            if hidden_count:
                result.condensed += hidden_count
                start = s.pages[pi].start
                if result.first_condensed_entry is None or start < result.first_condensed_entry:
                    result.first_condensed_entry = start
    return result
