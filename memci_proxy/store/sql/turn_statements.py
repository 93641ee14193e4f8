"""The statements of one persisted turn (see SqlConversationRepository.save_turn).

Every write is an upsert, so replaying a turn (a retry after a lost reply) changes nothing:
entries are immutable per (seq, hash) (an edited history under a session key replaces them), pages take their newest range/state/summary while
recall counters only grow, fingerprints keep their first owner (the conversation a shared prefix
was first seen in), hidden messages and contents snapshots take the latest text.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import case, func, or_
from sqlalchemy.dialects.postgresql import insert

from memci_proxy.store.ports import EntryRow, EventRow, PageRow
from memci_proxy.store.sql.models import ContentsSnapshot, Entry, Event, Fingerprint, HiddenMessage, Page

entries_t = Entry.__table__
pages_t = Page.__table__
fingerprints_t = Fingerprint.__table__
hidden_t = HiddenMessage.__table__
contents_t = ContentsSnapshot.__table__
events_t = Event.__table__

_entry_insert = insert(entries_t)
# Same seq, same hash: the same message, nothing to do. Same seq, another hash: the client edited its history
# under an explicit session key (the conversation continues from the edit), so the newer message wins.
INSERT_ENTRIES = _entry_insert.on_conflict_do_update(
    index_elements=["conversation_id", "seq"],
    set_={"hash": _entry_insert.excluded.hash, "role": _entry_insert.excluded.role,
          "message": _entry_insert.excluded.message, "tokens": _entry_insert.excluded.tokens},
    where=entries_t.c.hash != _entry_insert.excluded.hash,
)

_page_insert = insert(pages_t)
_new = _page_insert.excluded
UPSERT_PAGES = _page_insert.on_conflict_do_update(
    index_elements=["conversation_id", "number"],
    set_={
        "first_seq": _new.first_seq,
        "last_seq": _new.last_seq,
        "state": _new.state,
        "tokens": _new.tokens,
        "summary": _new.summary,
        # PostgreSQL's GREATEST ignores NULLs.
        "recall_count": func.greatest(pages_t.c.recall_count, _new.recall_count),
        "last_recalled_turn": func.greatest(pages_t.c.last_recalled_turn, _new.last_recalled_turn),
        "archived_at": case(
            (_new.state == "active", None), else_=func.coalesce(pages_t.c.archived_at, _new.archived_at)
        ),
    },
    where=or_(
        pages_t.c.first_seq != _new.first_seq,
        pages_t.c.last_seq != _new.last_seq,
        pages_t.c.state != _new.state,
        pages_t.c.tokens != _new.tokens,
        pages_t.c.summary != _new.summary,
        pages_t.c.recall_count < _new.recall_count,
        func.coalesce(pages_t.c.last_recalled_turn, -1) < func.coalesce(_new.last_recalled_turn, -1),
    ),
)

INSERT_FINGERPRINTS = insert(fingerprints_t).on_conflict_do_nothing(index_elements=["tenant", "chain_hash"])

_hidden_insert = insert(hidden_t)
UPSERT_HIDDEN = _hidden_insert.on_conflict_do_update(
    index_elements=["conversation_id", "after_seq", "ordinal"],
    set_={"message": _hidden_insert.excluded.message},
)

_contents_insert = insert(contents_t)
UPSERT_CONTENTS = _contents_insert.on_conflict_do_update(
    index_elements=["conversation_id", "epoch"],
    set_={"text": _contents_insert.excluded.text},
)

INSERT_EVENTS = insert(events_t)


def entry_params(conversation_id: str, entries: list[EntryRow]) -> list[dict[str, Any]]:
    return [
        {
            "conversation_id": conversation_id,
            "seq": e.seq,
            "hash": e.hash,
            "role": e.role,
            "message": e.message,
            "tokens": e.tokens,
        }
        for e in entries
    ]


def page_params(conversation_id: str, pages: list[PageRow]) -> list[dict[str, Any]]:
    now = dt.datetime.now(dt.timezone.utc)
    return [
        {
            "conversation_id": conversation_id,
            "number": p.number,
            "first_seq": p.first_seq,
            "last_seq": p.last_seq,
            "state": p.state,
            "tokens": p.tokens,
            "summary": p.summary,
            "recall_count": p.recall_count,
            "last_recalled_turn": p.last_recalled_turn,
            "archived_at": None if p.state == "active" else now,
        }
        for p in sorted(pages, key=lambda page: page.first_seq)
    ]


def fingerprint_params(tenant: str, conversation_id: str, fingerprints: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [
        {"tenant": tenant, "chain_hash": chain_hash, "conversation_id": conversation_id, "length": length}
        for chain_hash, length in fingerprints
    ]


def hidden_params(conversation_id: str, hidden: list[tuple[int, int, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {"conversation_id": conversation_id, "after_seq": after_seq, "ordinal": ordinal, "message": message}
        for after_seq, ordinal, message in hidden
    ]


def event_params(events: list[EventRow]) -> list[dict[str, Any]]:
    return [
        {"tenant": e.tenant, "conversation_id": e.conversation_id, "kind": e.kind, "payload": e.payload}
        for e in events
    ]
