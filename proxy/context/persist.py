"""What a planned turn must write to the store of truth, as rows."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.engine import ConversationState, Plan
from proxy.engine.state import STATUS_NAMES
from proxy.store.ports import EntryRow, EventRow, PageRow


@dataclass
class TurnRows:
    entries: list[EntryRow]
    pages: list[PageRow]
    fingerprints: list[tuple[str, int]]
    events: list[EventRow]
    contents: tuple[int, str] | None


def turn_rows(
    tenant: str, conversation_id: str, plan: Plan, state: ConversationState, chains: list[str], known_prefix: int,
    also_pages: list[str] | tuple[str, ...] = (),
) -> TurnRows:
    entries = [
        EntryRow(seq=index, hash=digest, role=str(message.get("role", "")), message=message, tokens=tokens)
        for index, message, digest, tokens in plan.new_entries
    ]
    first_new = min((e.seq for e in entries), default=len(state.hashes))
    changed = {str(label) for label in plan.archived} | {str(label) for label, _ in plan.evicted} | set(also_pages)
    pages = [
        PageRow(
            number=p.label, first_seq=p.start, last_seq=p.end - 1, state=STATUS_NAMES[p.status], tokens=p.tokens,
            summary=p.contents, recall_count=p.recall_count,
            last_recalled_turn=p.last_recalled_turn if p.last_recalled_turn >= 0 else None,
        )
        for p in state.pages
        if p.end > first_new or p.label in changed or plan.epoch
    ]
    fingerprints = [(chains[i], i + 1) for i in range(max(0, known_prefix), len(chains))]
    events = [
        EventRow(tenant, conversation_id, str(ev.get("type") or ev.get("kind") or "context.event"), ev) for ev in plan.events
    ]
    contents = (state.epoch, state.contents_text) if plan.epoch else None
    return TurnRows(entries, pages, fingerprints, events, contents)
