"""What a turn must write to the store of truth, as rows, gathered until they are written.

A snapshot is always written together with every row of the turns it covers (one transaction), so a stored state
never names an entry the entries table lacks. Rows of several turns of one conversation merge (the newest version
of a row wins), which is how queued turns coalesce into one write.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memci_proxy.engine import ConversationState, Plan
from memci_proxy.engine.state import STATUS_NAMES, PageRecord, common_prefix_of_records, find_page
from memci_proxy.store.ports import EntryRow, EventRow, PageRow, SnapshotBase, TurnWrite


@dataclass
class RowSet:
    entries: dict[int, EntryRow] = field(default_factory=dict)
    pages: dict[str, PageRow] = field(default_factory=dict)
    fingerprints: dict[str, int] = field(default_factory=dict)  # chain hash -> prefix length
    events: list[EventRow] = field(default_factory=list)
    hidden: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # (after entry, ordinal) -> message
    contents: tuple[int, str] | None = None  # (epoch, contents page) of the newest epoch

    def merge(self, newer: RowSet) -> None:
        self.entries.update(newer.entries)
        self.pages.update(newer.pages)
        for chain_hash, length in newer.fingerprints.items():
            self.fingerprints.setdefault(chain_hash, length)
        self.events.extend(newer.events)
        self.hidden.update(newer.hidden)
        if newer.contents is not None:
            self.contents = newer.contents

    def write(self, tenant: str, conversation_id: str, snapshot: bytes, version: int, base: SnapshotBase | None,
              index_behind: bool = False) -> TurnWrite:
        return TurnWrite(
            tenant, conversation_id, snapshot, version, base,
            entries=list(self.entries.values()), pages=list(self.pages.values()),
            fingerprints=list(self.fingerprints.items()), events=list(self.events), contents=self.contents,
            hidden=[(after, ordinal, message) for (after, ordinal), message in self.hidden.items()],
            index_behind=index_behind,
        )

    def newest_fingerprints(self, count: int = 4) -> list[tuple[str, int]]:
        return sorted(self.fingerprints.items(), key=lambda item: item[1])[-count:]


def _page_row(p: PageRecord) -> PageRow:
    return PageRow(
        number=p.label, first_seq=p.start, last_seq=p.end - 1, state=STATUS_NAMES[p.status], tokens=p.tokens,
        summary=p.contents, recall_count=p.recall_count,
        last_recalled_turn=p.last_recalled_turn if p.last_recalled_turn >= 0 else None,
    )


def page_rows(state: ConversationState, labels: Iterable[str]) -> dict[str, PageRow]:
    out: dict[str, PageRow] = {}
    for label in labels:
        index = find_page(state, label)
        if index is not None:
            out[label] = _page_row(state.pages[index])
    return out


def changed_pages(before: ConversationState | None, state: ConversationState) -> dict[str, PageRow]:
    """The rows of the pages whose record is not the one ``before`` had at the same place (every page without a
    ``before``): the leading records both share are passed over in C."""
    pages = state.pages
    if before is None:
        return {p.label: _page_row(p) for p in pages}
    known = before.pages
    out: dict[str, PageRow] = {}
    for i in range(common_prefix_of_records(known, pages), len(pages)):
        record = pages[i]
        if i >= len(known) or known[i] != record:
            out[record.label] = _page_row(record)
    return out


def turn_rows(
    tenant: str, conversation_id: str, plan: Plan, state: ConversationState, fingerprints: list[tuple[str, int]],
    before: ConversationState | None,
) -> RowSet:
    """The rows of a turn planned from ``before`` (the state whose rows are stored or queued; None: nothing is):
    its new entries, the pages they touch and every page whose record changed (at an epoch: those archived,
    evicted, condensed; with no ``before``, every page), the fingerprints of the prefixes not known before, events,
    and the contents page of a new epoch. Work proportional to the new messages and the changed pages: an epoch of
    a long chat no longer re-sends its hundreds of unchanged pages."""
    rows = RowSet()
    for index, message, digest, tokens in plan.new_entries:
        rows.entries[index] = EntryRow(seq=index, hash=digest, role=str(message.get("role", "")), message=message,
                                       tokens=tokens)
    first_new = min(rows.entries, default=state.entry_count)
    for p in reversed(state.pages):  # pages are in entry order: the touched ones are at the end
        if p.end <= first_new:
            break
        rows.pages[p.label] = _page_row(p)
    rows.pages.update(changed_pages(before, state))  # the pages archived and evicted among them
    rows.fingerprints.update(fingerprints)
    rows.events = [
        EventRow(tenant, conversation_id, str(ev.get("type") or ev.get("kind") or "context.event"), ev)
        for ev in plan.events
    ]
    if plan.epoch:
        rows.contents = (state.epoch, state.contents_text)
    return rows


def hidden_rows(after: int, first_ordinal: int, messages: list[dict[str, Any]]) -> dict[tuple[int, int], dict]:
    return {(after, first_ordinal + i): m for i, m in enumerate(messages)}
