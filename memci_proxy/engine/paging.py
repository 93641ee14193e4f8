"""Pages as views over the entry list: appending new entries, continuation pages, truncation on forks."""

from __future__ import annotations

import bisect

import msgspec

from .state import ACTIVE, ARCHIVED, EVICTED, HASH_SIZE, ConversationState, PageRecord

replace = msgspec.structs.replace


def append_entry(
    state: ConversationState, index: int, role: object, tokens: int, page_max_tokens: int, now: float
) -> None:
    """Add entry `index` (its token count already appended) to the page structure of `state` (in place).

    A user message opens a new page, except that messages before the first user message belong to page 1.
    An assistant message opens a continuation page when the open page would pass `page_max_tokens`, so a
    page is never split between an assistant tool call and its tool results.
    """
    pages = state.pages
    last = pages[-1] if pages else None
    if last is None:
        new = PageRecord(state.next_page, 1, index, index + 1, tokens, has_user=role == "user", first_seen=now)
        state.next_page += 1
    elif role == "user" and last.has_user:
        new = PageRecord(state.next_page, 1, index, index + 1, tokens, has_user=True, first_seen=now)
        state.next_page += 1
    elif last.status != ACTIVE or (
        role == "assistant" and last.end > last.start and last.tokens + tokens > page_max_tokens
    ):
        new = PageRecord(
            last.number,
            last.part + 1,
            index,
            index + 1,
            tokens,
            has_user=last.has_user or role == "user",
            first_seen=now,
        )
    else:
        pages[-1] = replace(
            last, end=index + 1, tokens=last.tokens + tokens, has_user=last.has_user or role == "user"
        )
        state.active_tokens += tokens
        return
    pages.append(new)
    state.active_tokens += tokens


def truncate(state: ConversationState, keep: int, next_role: object = None) -> tuple[list[str], bool]:
    """Drop every entry from `keep` on (in place). Returns the labels of the pages dropped entirely
    and whether the contents page lost an entry.

    Hidden messages after dropped entries go too. A page cut in the middle keeps its number; if it was
    archived and is cut, it comes back into the active chapter (its remaining entries are still the
    client's, and the new entries that follow must not be separated from them). So does an archived last
    page when the next message (`next_role`) would continue it rather than open a new page.
    """
    dropped: list[str] = []
    contents_changed = False
    state.hash_blob = state.hash_blob[: keep * HASH_SIZE]
    del state.tokens[keep:]
    del state.condensed[bisect.bisect_left(state.condensed, keep) :]
    state.hidden = [g for g in state.hidden if g.after < keep]
    # offloaded outputs of dropped entries go too; their numbers are not given again
    highest_offloaded = max((r.number for r in state.offloads), default=0)
    state.offloads = [r for r in state.offloads if r.entry < keep]
    highest_archived_number = 0
    kept: list[PageRecord] = []
    for record in state.pages:
        if record.start >= keep:
            dropped.append(record.label)
            if record.status != ACTIVE:
                highest_archived_number = max(highest_archived_number, record.number)
                contents_changed = contents_changed or record.status != EVICTED
        elif record.end > keep:
            kept.append(record)  # re-measured below
        else:
            kept.append(record)
    state.pages = kept
    reopen = bool(kept) and next_role is not None and next_role != "user" and kept[-1].status != ACTIVE
    if kept and (kept[-1].end > keep or reopen):
        last = kept[-1]
        contents_changed = contents_changed or last.status == ARCHIVED
        hidden_tokens = sum(g.tokens for g in state.hidden if last.start <= g.after < keep)
        kept[-1] = replace(
            last,
            end=keep,
            tokens=sum(state.tokens[last.start : keep]) + hidden_tokens,
            status=ACTIVE,
            archived_turn=-1,
            contents="",
            contents_tokens=0,
        )
    state.first_active_page = min(state.first_active_page, len(kept))
    if kept and kept[-1].status == ACTIVE:
        # a cut archived page came back: everything from it on is active
        state.first_active_page = min(state.first_active_page, len(kept) - 1)
    state.active_tokens = sum(p.tokens for p in kept[state.first_active_page :])
    top = max((p.number for p in kept), default=0)
    state.next_page = max(top, highest_archived_number, highest_offloaded) + 1
    return dropped, contents_changed
