"""One vocabulary of page states (memci_proxy.engine.state.STATUS_MEANINGS): the same names and counts in the
X-Memci-Pages-* headers, `inspect`, the store and docs/memory.md#page-states."""

from __future__ import annotations

from pathlib import Path

from memci_proxy import prompt_view
from memci_proxy.engine.state import ACTIVE, ARCHIVED, EVICTED, STATUS_MEANINGS, STATUS_NAMES, ConversationState, PageRecord
from memci_proxy.store.ports import PAGE_STATES
from memci_proxy.turn.page_counts import page_headers

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _state(statuses: list[int], epoch: int = 3) -> ConversationState:
    pages = [PageRecord(number=i + 1, part=1, start=i, end=i + 1, tokens=10, status=s) for i, s in enumerate(statuses)]
    first_active = next((i for i, s in enumerate(statuses) if s == ACTIVE), len(statuses))
    return ConversationState(pages=pages, first_active_page=first_active, epoch=epoch)


def test_the_store_the_engine_and_the_meanings_name_the_same_states() -> None:
    assert tuple(STATUS_NAMES.values()) == PAGE_STATES == tuple(STATUS_MEANINGS)


def test_the_docs_define_every_state_as_the_code_does() -> None:
    text = (DOCS / "memory.md").read_text(encoding="utf-8")
    section = text.split("## Page states", 1)[1].split("\n## ", 1)[0]
    for name, meaning in STATUS_MEANINGS.items():
        assert f"| `{name}` | {meaning} |" in section
    endpoints = (DOCS / "endpoints.md").read_text(encoding="utf-8")
    for header in ("X-Memci-Pages-Active", "X-Memci-Pages-Archived", "X-Memci-Pages-Evicted"):
        assert f"`{header}`" in endpoints


def test_the_headers_and_inspect_count_the_same_pages() -> None:
    statuses = [EVICTED] * 27 + [ARCHIVED] + [ACTIVE] * 3
    state = _state(statuses)
    headers = page_headers("c-states", state)
    assert headers == {"X-Memci-Pages-Active": "3", "X-Memci-Pages-Archived": "28", "X-Memci-Pages-Evicted": "27"}
    view = {"conversation_id": "c-states", "epoch": 3, "messages": [],
            "pages": [{"number": str(i + 1), "state": STATUS_NAMES[s]} for i, s in enumerate(statuses)]}
    shown = prompt_view.render(view, color=False)
    assert "pages: 3 active, 28 archived (1 on the contents page, 27 evicted)" in shown
    text = (DOCS / "memory.md").read_text(encoding="utf-8")  # the docs' example is what the tools print
    assert "`X-Memci-Pages-Active: 3`, `X-Memci-Pages-Archived: 28`, `X-Memci-Pages-Evicted: 27`" in text
    assert "`pages: 3 active, 28 archived (1 on the contents page, 27 evicted)`" in text
    assert f"evicted: {STATUS_MEANINGS['evicted']}" in shown


def test_the_split_is_counted_once_per_epoch() -> None:
    state = _state([ARCHIVED, EVICTED, ACTIVE], epoch=5)
    assert page_headers("c-memo", state)["X-Memci-Pages-Evicted"] == "1"
    state.pages[0] = PageRecord(number=1, part=1, start=0, end=1, tokens=10, status=EVICTED)  # as an epoch would
    assert page_headers("c-memo", state)["X-Memci-Pages-Evicted"] == "1"  # remembered for epoch 5
    state.epoch = 6
    assert page_headers("c-memo", state)["X-Memci-Pages-Evicted"] == "2"


def test_inspect_says_whether_the_turn_was_an_epoch_in_words() -> None:
    view = {"conversation_id": "c", "messages": [], "pages": []}
    assert "(a compaction epoch)" in prompt_view.render({**view, "epoch": True}, color=False)
    quiet = prompt_view.render({**view, "epoch": False}, color=False)
    assert "epoch" not in quiet and "True" not in quiet and "False" not in quiet
