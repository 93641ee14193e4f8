"""`plan`: one request in, the upstream messages and the next state out. Pure: time and feedback are inputs."""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from .compaction import EpochResult, run_epoch
from .condense import message_images
from .config import EngineConfig
from .contents import render_contents
from .fingerprint import advance_prefix, encode_messages, entry_digest
from .layout import (
    entry_position, frozen_volatile, leads_in_place, memory_block, render_active, render_system_text,
    system_message_text, volatile_block,
)
from .offload_state import active_previews, offload_on_arrival, restore_active
from .paging import append_entry, truncate
from .state import ConversationState, common_prefix_of_blobs
from .tokens import TokenCounter

EPOCH_HIGH_WATERMARK = "high_watermark"
EPOCH_COLD_CACHE = "cold_cache"


@dataclass
class TurnInput:
    """One client request. `system`: the client's leading system/developer messages (B1, see
    `split_leading_system`); `messages`: the rest, exactly as sent (never mutated). `profile` (B2a) and
    `summary` (B4) are applied at epochs only; `task_state` (B3), `intent` (B2b) and `memory` (B5) are
    appended to the latest user message of this request only, inside <memci-context>...</memci-context>.
    While an agent loop continues after that user message, it keeps the blocks it got when it was the last
    message (so the prompt stays append-only); new blocks apply when a new user message arrives."""

    system: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    tools_tokens: int = 0
    max_tokens: int | None = None
    now: float = 0.0
    profile: str = ""
    summary: str = ""
    task_state: str = ""
    intent: str = ""
    memory: str = ""
    # Optional: the raw JSON bytes of the request body's `messages` array as received (leading system
    # messages included), e.g. a `msgspec.Raw` of that field. With it the engine checks the known prefix by
    # hashing those bytes instead of re-encoding every message (several times faster on long histories).
    raw_messages: bytes | None = None
    # Descriptions of images, keyed by `condense.ImageRef.key` (sha256 of the image bytes, or of a remote URL),
    # as far as they are ready. Read only at epochs: an image that decays then takes its description (or the
    # placeholder with its type and size when none is ready), and keeps that text until its page is archived.
    image_descriptions: Mapping[str, str] = field(default_factory=dict)
    # First-sight offload for this request (X-Memci-Offload): off offloads nothing new and shows the active
    # offloaded outputs in full again.
    offload: bool = True


@dataclass
class Plan:
    """What to send upstream and what to persist. Page references are labels: "12", "12.2" (continuation).

    `archived` pages must be stored durably before `messages` is sent; `evicted` are (label, rule) with rule
    "unrecalled", "unchanged" or "lru"; `dropped_pages` left the conversation at a fork (`forked_at` = first
    entry that differed). `blocks`: ("system", 0, 1), ("B6", start, end), ("tail", i, i + 1) for the message
    carrying the volatile blocks. `over_budget`: even after an epoch the prompt exceeds the budget (the fixed part and
    the newest page alone do not fit): the caller sends it with a smaller answer, or refuses the turn when not even
    that fits (`EngineConfig.fits`).
    `stable_prefix_messages`: leading messages identical to the previous request's."""

    state: ConversationState
    messages: list[dict[str, Any]]
    blocks: list[tuple[str, int, int]]
    epoch: bool = False
    epoch_reason: str | None = None
    epoch_due: bool = False  # an epoch was due (made, or not made since nothing could change)
    new_entries: list[tuple[int, dict[str, Any], str, int]] = field(default_factory=list)
    archived: list[str] = field(default_factory=list)
    evicted: list[tuple[str, str]] = field(default_factory=list)
    condensed_count: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    over_budget: bool = False
    budget: int = 0
    estimated_tokens: int = 0
    forked_at: int | None = None
    stable_prefix_messages: int = 0
    dropped_pages: list[str] = field(default_factory=list)
    # Outputs offloaded on arrival by this plan (pages of their own, to be stored before `messages` is sent),
    # and the tokens their previews save on this prompt (full minus preview, raw estimate).
    offloaded: list[str] = field(default_factory=list)
    offload_tokens_saved: int = 0


def split_leading_system(messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The client's leading system/developer messages (B1) and the conversation after them."""
    i = 0
    while i < len(messages) and messages[i].get("role") in ("system", "developer"):
        i += 1
    return list(messages[:i]), list(messages[i:])


def _digest(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8", "surrogatepass"))


def _system_tokens(text: str | None, counter: TokenCounter) -> int:
    return 0 if text is None else counter.count_message({"role": "system", "content": text})


def watermarks(cfg: EngineConfig, budget: int, fixed_part: float) -> tuple[float, float]:
    """The estimated prompt at which an epoch starts (the fixed part plus ``high_watermark`` of the room above it),
    and the one it brings the prompt down to (``low_watermark`` of the budget: under a large fixed part that means
    every page but the open one is archived, which costs the least prefill). Measured (docs/benchmarks.md): the low
    mark as a share of the room too kept more after each epoch and lost 0.6-0.9 point on the chat, chat-zh and agent
    workloads, and gained nothing more on the agent with a 15k fixed part."""
    base = min(max(0.0, fixed_part), float(budget))
    return base + cfg.high_watermark * (budget - base), cfg.low_watermark * budget


def _cache_cold(s: ConversationState, now: float, cfg: EngineConfig) -> bool:
    if s.last_turn_time is not None and now - s.last_turn_time > cfg.cache_ttl:
        return True
    expected = s.expected_cached_tokens * s.correction_ratio
    return (
        s.last_cached_tokens is not None
        and expected >= cfg.cold_cache_min_tokens
        and s.last_cached_tokens < cfg.cold_cache_ratio * expected
    )


def _last_user_entry(s: ConversationState, messages: Sequence[dict[str, Any]]) -> int:
    """Index of the latest user message if it is still in the active chapter, else -1."""
    for pi in range(len(s.pages) - 1, s.first_active_page - 1, -1):
        record = s.pages[pi]
        if record.part == 1 and record.has_user:
            for entry in range(record.start, record.end):
                if messages[entry].get("role") == "user":
                    return entry
            return -1
    return -1


def plan(state: ConversationState | None, turn: TurnInput, config: EngineConfig, counter: TokenCounter) -> Plan:
    cfg = config
    msgs = turn.messages
    budget = cfg.budget(turn.max_tokens)
    s = ConversationState() if state is None else state.copy()
    s.turn += 1
    events: list[dict[str, Any]] = []

    # -- 1. which entries are known: byte-identical prefix (cheap) or entry hashes (edits, new clients)
    raw_kind = "raw" if turn.raw_messages is not None else "encoded"
    array = turn.raw_messages if turn.raw_messages is not None else encode_messages(msgs)
    same_kind = state is not None and state.messages_kind == raw_kind
    intact, array_end, array_digest = advance_prefix(
        array, s.messages_length if same_kind else 0, s.messages_digest if same_kind else ""
    )
    known = s.entry_count
    digests: list[bytes] | None = None
    if state is not None and intact:
        keep = known
    else:
        digests = [entry_digest(m) for m in msgs]
        keep = 0 if state is None else common_prefix_of_blobs(s.hash_blob, b"".join(digests))
    forked_at: int | None = None
    dropped: list[str] = []
    contents_dirty = False
    changed_at: list[int] = []  # entries whose rendering changed since the previous request
    if keep < known:
        forked_at = keep
        dropped, contents_dirty = truncate(s, keep, msgs[keep].get("role") if keep < len(msgs) else None)
        changed_at.append(keep)
        events.append({"type": "context.forked", "at": keep, "dropped_pages": dropped})

    # -- 2. new entries -> pages
    new_entries: list[tuple[int, dict[str, Any], str, int]] = []
    new_digests: list[bytes] = []
    page_limit = cfg.page_limit()
    offloading = cfg.offload and turn.offload
    limits = cfg.offload_limits() if offloading else None
    offloaded: list[str] = []
    saved = 0
    for i in range(keep, len(msgs)):
        m = msgs[i]
        d = digests[i] if digests is not None else entry_digest(m)
        t = counter.count_message(m)
        new_digests.append(d)
        s.tokens.append(t)
        append_entry(s, i, m.get("role"), t, page_limit, turn.now)
        if limits is not None and t > limits.preview_tokens:
            record = offload_on_arrival(s, i, m, t, d, limits, counter)
            if record is not None:
                offloaded.append(record.label)
                saved += t - s.tokens[i]
                events.append({"type": "context.offloaded", "page": record.label, "entry": i, "kind": record.kind,
                               "tokens": t, "preview_tokens": s.tokens[i], "lines": record.lines})
        new_entries.append((i, m, d.hex(), t))
    if new_digests:
        s.hash_blob += b"".join(new_digests)
    if not offloading and s.offloads:
        changed_at.extend(restore_active(s, msgs, counter, cfg.condense_tool_chars))

    # -- 3. the system message: B1 follows the client at once; profile, summary, contents wait for epochs
    b1 = system_message_text(turn.system)
    b1_digest = _digest(b1)
    recall_tool = cfg.recall_tool_name if cfg.recall_enabled else None
    previous_system = s.system_text if state is not None else None
    previous_b1_digest = s.b1_digest if state is not None else None
    if state is None:
        s.profile, s.summary = turn.profile, turn.summary
    if contents_dirty:
        s.contents_text = render_contents(s.pages, recall_tool)
    if s.b1_tokens < 0 or b1_digest != s.b1_digest:
        s.b1_tokens = _system_tokens(b1 or None, counter)
    if state is None or contents_dirty or b1_digest != s.b1_digest:
        s.b1_digest = b1_digest
        s.system_text = render_system_text(b1, s.profile, s.summary, s.contents_text)
        s.system_tokens = _system_tokens(s.system_text, counter)

    # -- 4. estimate and decide on an epoch
    # Volatile blocks go into the latest user message. While an agent loop continues after that message
    # (the request ends with later messages), the blocks it got when it arrived are kept byte for byte.
    # A user message followed by hidden messages (a recall exchange spliced back) keeps, for good, the blocks it
    # carried when they were added (none if it had none): the hidden messages' prefix never changes.
    last_user = _last_user_entry(s, msgs)
    volatile = volatile_block(turn.task_state, turn.intent, turn.memory)
    frozen = any(g.after == last_user for g in s.hidden) if last_user >= 0 else False
    if frozen:
        volatile = next(g.volatile for g in s.hidden if g.after == last_user)
    elif state is not None and 0 <= last_user == state.last_volatile_entry and last_user < min(keep, len(msgs) - 1):
        volatile = state.last_volatile_text
    # frozen blocks count with their hidden group's tokens
    fixed = (counter.count_text(volatile) if volatile and not frozen else 0) + max(0, turn.tools_tokens)
    ratio = s.correction_ratio

    def estimate() -> int:
        return math.ceil((s.system_tokens + s.active_tokens + fixed) * ratio)

    est = estimate()
    # The high watermark is a share of the room the client's fixed part (its system message and tools) leaves: with a
    # large fixed part (an agent's 14k tokens of instructions and tools) a share of the whole budget leaves little
    # room between epochs, and nearly every turn is one.
    high_mark, low_mark = watermarks(cfg, budget, (s.b1_tokens + max(0, turn.tools_tokens)) * ratio)
    reason: str | None = None
    if est > high_mark:
        reason = EPOCH_HIGH_WATERMARK
    elif state is not None and _cache_cold(state, turn.now, cfg):
        refresh = turn.profile != s.profile or turn.summary != s.summary
        if est > low_mark or refresh:
            reason = EPOCH_COLD_CACHE

    result = EpochResult()
    first_active_before = s.first_active_page
    epoch_due = reason is not None
    if reason is not None:
        if ratio < 1.0 and _active_images(s, msgs):
            # The ratio was learned with images in the prompt (a flat estimate per image); once they decay to
            # text it no longer holds, and below 1 it would under-count the text: start again from 1.
            ratio = s.correction_ratio = 1.0
        image_texts = ChainMap(s.image_texts, turn.image_descriptions)  # texts already sent win
        result = run_epoch(
            s, msgs, cfg, counter, fixed, ratio, low_mark, cfg.contents_limit(budget),
            image_texts, last_resort_target=high_mark,
        )
        s.image_texts = _frozen_image_texts(s, msgs, image_texts)
        refresh = turn.profile != s.profile or turn.summary != s.summary
        if result.archived or result.evicted or refresh:
            s.profile, s.summary = turn.profile, turn.summary
            s.contents_text = render_contents(s.pages, recall_tool)
            s.system_text = render_system_text(b1, s.profile, s.summary, s.contents_text)
            s.system_tokens = _system_tokens(s.system_text, counter)
        if result.first_condensed_entry is not None:
            changed_at.append(result.first_condensed_entry)
        if result.archived or result.evicted or result.condensed or refresh:
            s.epoch += 1
        else:
            reason = None  # nothing could change: not an epoch, the prompt stays append-only
        est = estimate()

    # -- 5. render: [system] + B6 with hidden messages, volatile blocks in the last user message
    start = s.active_start_entry()
    volatile_entry = last_user if last_user >= start else -1
    if volatile and volatile_entry < 0:
        events.append({"type": "context.volatile_dropped", "reason": "latest user message is archived"})
    # The client's system message (B1) alone first: it and the tools the chat template renders after it stay a
    # byte-identical prefix across epochs. The proxy's blocks that change at epochs (B2a, B4) lead the first active
    # message (in it when it is a user message, else a user message of its own: `head` counts it).
    system_count = 1 if b1 else 0
    rendered_volatile = frozen_volatile(s.hidden, start)
    if volatile_entry >= 0:
        rendered_volatile[volatile_entry] = volatile
    lead = memory_block(s.profile, s.summary, s.contents_text)
    head = system_count + (1 if lead and (start >= len(msgs) or not leads_in_place(msgs[start])) else 0)
    over_budget = est > budget
    if over_budget:
        events.append({"type": "context.over_budget", "estimated_tokens": est, "budget_tokens": budget})
    # Even after an epoch the prompt passes the budget (its fixed part and newest turn alone do): the caller sends it
    # with a smaller answer while one fits in the window (EngineConfig.fits), else refuses the turn; never unmanaged.
    upstream = [{"role": "system", "content": b1}] if system_count else []
    previews = active_previews(s, msgs, start, cfg.condense_tool_chars) if s.offloads else None
    upstream.extend(render_active(msgs, start, s.condensed, s.hidden, cfg.condense_tool_chars,
                                  rendered_volatile, s.image_texts, previews, lead))
    blocks: list[tuple[str, int, int]] = []
    if system_count:
        blocks.append(("system", 0, 1))
    blocks.append(("B6", system_count, len(upstream)))
    if lead:
        blocks.append(("B4", system_count, system_count + 1))
    if volatile and volatile_entry >= start:
        tail = entry_position(volatile_entry, start, s.hidden, head)
        blocks.append(("tail", tail, tail + 1))

    # -- 6. what stayed byte-identical since the previous request (drives the cold-cache check)
    volatile_text = volatile if volatile_entry >= 0 else ""
    if state is not None and (
        state.last_volatile_entry != volatile_entry or state.last_volatile_text != volatile_text
    ):
        old_entry = state.last_volatile_entry
        if old_entry >= 0 and state.last_volatile_text != rendered_volatile.get(old_entry, ""):
            changed_at.append(old_entry)
        if volatile_entry >= 0 and volatile_text and volatile_entry != old_entry:
            changed_at.append(volatile_entry)
    if state is None or state.last_upstream_count == 0:
        stable = 0
    elif (s.system_text != previous_system or s.first_active_page != first_active_before
          or state.active_start_entry() != start):
        # the proxy's blocks or the first active page changed: the client's system message (and tools) stayed
        stable = system_count if b1_digest == previous_b1_digest else 0
    else:
        stable = state.last_upstream_count
        for entry in changed_at:
            if entry >= start:
                stable = min(stable, entry_position(entry, start, s.hidden, head))
        stable = min(stable, _first_new_hidden_position(s, state.turn, start, head))
        stable = min(stable, len(upstream))
    if stable == 0:
        s.expected_cached_tokens = 0
    elif stable <= head:  # the client's system message alone
        s.expected_cached_tokens = _system_tokens(b1 or None, counter)
    else:
        stable_entries_end = start + stable - head  # approximate: ignores hidden messages
        s.expected_cached_tokens = s.system_tokens + sum(s.tokens[start:min(stable_entries_end, len(s.tokens))])

    # -- 7. bookkeeping for the next request
    s.messages_kind, s.messages_length, s.messages_digest = raw_kind, array_end, array_digest
    s.last_upstream_count = len(upstream)
    s.last_volatile_entry = volatile_entry
    s.last_volatile_text = volatile_text
    s.last_turn_time = turn.now
    s.last_cached_tokens = None

    if reason is not None:
        events.append(
            {
                "type": "context.compressed",
                "reason": reason,
                "epoch": s.epoch,
                "original_count": len(turn.system) + len(msgs),
                "compressed_count": len(upstream),
                "estimated_tokens": est,
                "budget_tokens": budget,
                "archived": list(result.archived),
                "evicted": [list(e) for e in result.evicted],
                "condensed": result.condensed,
            }
        )
    return Plan(
        state=s,
        messages=upstream,
        blocks=blocks,
        epoch=reason is not None,
        epoch_reason=reason,
        epoch_due=epoch_due,
        new_entries=new_entries,
        archived=result.archived,
        evicted=result.evicted,
        condensed_count=result.condensed,
        events=events,
        over_budget=over_budget,
        budget=budget,
        estimated_tokens=est,
        forked_at=forked_at,
        stable_prefix_messages=stable,
        dropped_pages=dropped,
        offloaded=offloaded,
        offload_tokens_saved=saved,
    )


def _active_images(s: ConversationState, messages: Sequence[dict[str, Any]]) -> bool:
    """Whether an active entry not yet condensed holds an image part."""
    condensed = set(s.condensed)
    return any(
        isinstance(messages[entry].get("content"), list) and entry not in condensed and message_images(messages[entry])
        for entry in range(s.active_start_entry(), len(messages))
    )


def _frozen_image_texts(
    s: ConversationState, messages: Sequence[dict[str, Any]], texts: Mapping[str, str]
) -> dict[str, str]:
    """The description each image of the active condensed entries decayed to ("" = the placeholder)."""
    start = s.active_start_entry()
    frozen: dict[str, str] = {}
    for entry in s.condensed:
        if start <= entry < len(messages):
            for ref in message_images(messages[entry]):
                frozen[ref.key] = texts.get(ref.key) or ""
    return frozen


def _first_new_hidden_position(s: ConversationState, since_turn: int, start: int, system_count: int) -> int:
    """Upstream position of the first hidden message added since the last plan (a large number if none)."""
    best = 1 << 62
    same_after = 0
    previous_after = -1
    for g in s.hidden:
        same_after = same_after if g.after == previous_after else 0
        previous_after = g.after
        if g.added_turn >= since_turn and g.after >= start:
            position = entry_position(g.after, start, s.hidden, system_count) + 1 + same_after
            best = min(best, position)
        same_after += len(g.messages)
    return best
