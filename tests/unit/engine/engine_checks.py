"""Shared checks of the engine's invariants, used by the property and unit tests."""

from __future__ import annotations

from typing import Any

from memci_proxy.engine import ACTIVE, ConversationState, EngineConfig, Plan, condense_message, page_entry_range
from memci_proxy.engine.layout import memory_block
from memci_proxy.engine.output_preview import output_text, split_lines
from memci_proxy.workers.covering import archived_through


def check_pages(state: ConversationState, messages: list[dict[str, Any]]) -> None:
    """Pages tile the entry list, never start with a tool result, continuation parts number up."""
    pages = state.pages
    assert state.entry_count == len(messages) == len(state.tokens)
    if not messages:
        assert not pages
        return
    assert pages[0].start == 0 and pages[-1].end == len(messages)
    numbers_seen: list[int] = []
    for i, p in enumerate(pages):
        assert p.start < p.end
        if i:
            assert pages[i - 1].end == p.start
        assert messages[p.start].get("role") != "tool", f"page {p.label} starts with a tool result"
        if p.part > 1:
            prev = pages[i - 1]
            assert prev.number == p.number and prev.part == p.part - 1, (prev.label, p.label)
            assert messages[p.start].get("role") != "user"
        else:
            assert not numbers_seen or p.number > numbers_seen[-1]
            numbers_seen.append(p.number)
        for j in range(p.start + 1, p.end):
            if messages[j].get("role") == "user":
                # only page 1 may hold messages before its user message
                assert p.number == pages[0].number and p.part == 1
                assert all(messages[k].get("role") != "user" for k in range(p.start, j))
    for i, p in enumerate(pages):
        assert (p.status == ACTIVE) == (i >= state.first_active_page), (i, p.label, p.status)
    # what an epoch's memory waits for (memci_proxy.workers.covering) reads it off the first active page
    assert archived_through(state) == max((p.end - 1 for p in pages if p.status != ACTIVE), default=-1)


def check_tool_pairing(upstream: list[dict[str, Any]]) -> None:
    """Every assistant tool call has its result right after it, and no tool result is an orphan."""
    pending: set[str] = set()
    for m in upstream:
        role = m.get("role")
        if role == "tool":
            call_id = m.get("tool_call_id")
            assert call_id in pending, f"orphan tool result {call_id}"
            pending.discard(call_id)
            continue
        assert not pending, f"tool calls without results: {pending}"
        if role == "assistant":
            for call in m.get("tool_calls") or []:
                pending.add(call["id"])
    assert not pending or upstream[-1].get("role") == "assistant", f"unanswered tool calls {pending}"


def check_no_loss(plan: Plan, messages: list[dict[str, Any]], config: EngineConfig) -> None:
    """Each client message is in the upstream prompt (verbatim, or condensed) or in a known archived page."""
    state = plan.state
    start = state.active_start_entry()
    for i in range(start):
        record = next(p for p in state.pages if p.start <= i < p.end)
        assert record.status != ACTIVE
        assert page_entry_range(state, record.label) == (record.start, record.end)
    b6 = plan.messages[1:] if any(b[0] == "system" for b in plan.blocks) else plan.messages
    # the proxy's blocks that change at epochs lead the first active message, or are a user message of their own
    lead = memory_block(state.profile, state.summary, state.contents_text)
    assert any(b[0] == "B4" for b in plan.blocks) == bool(lead)
    in_place = bool(lead)
    if lead and b6 and b6[0] == {"role": "user", "content": lead} and (
            start >= len(messages) or messages[start].get("role") != "user"):
        b6, in_place = b6[1:], False
    client_part = [m for m in b6 if not m.get("_hidden")]  # hidden messages carry a marker in the tests
    assert len(client_part) == len(messages) - start, (len(client_part), len(messages), start)
    tail = next((b for b in plan.blocks if b[0] == "tail"), None)
    for offset, sent in enumerate(client_part):
        original = messages[start + offset]
        if offset == 0 and in_place:  # the memory block first, then the message as it would be without it
            assert original.get("role") == "user", (sent, original)
            content = sent["content"]
            if isinstance(content, list):
                assert content[0] == {"type": "text", "text": lead}
                rest: Any = content[1:]
            else:
                assert content.startswith(lead)
                rest = content[len(lead):].removeprefix("\n\n")
            sent = {**sent, "content": rest}
            if rest in ("", []) and not original.get("content"):
                continue
        if sent == original:
            continue
        condensed = condense_message(original, config.condense_tool_chars) or original
        if sent == condensed:
            continue
        offloaded = next((r for r in state.offloads if r.entry == start + offset), None)
        if offloaded is not None:
            check_preview(sent, original, offloaded.number)
            continue
        # the message carrying the volatile blocks (this request's, or those a user message followed by hidden
        # messages keeps): the client's text first, unchanged
        frozen = any(g.after == start + offset for g in state.hidden)
        assert (tail is not None or frozen) and original.get("role") == "user", (sent, original)
        content = original.get("content")
        if isinstance(content, list):
            assert sent["content"][: len(content)] == content
        else:
            assert sent["content"].startswith(content or "")


def check_preview(sent: dict[str, Any], original: dict[str, Any], number: int) -> None:
    """An offloaded message: the same message but its content, which names its page and shows, as a preview
    does, its first line (or, condensed, the start of it)."""
    assert {k: v for k, v in sent.items() if k != "content"} == {k: v for k, v in original.items() if k != "content"}
    text = sent["content"]
    assert isinstance(text, str) and f"page {number}" in text and f"page={number}" in text
    first = split_lines(output_text(original) or "")[0]
    assert first[:60] in text or (original.get("role") == "user" and text.startswith("[Pasted")), (first, text[:300])


def check_budget(plan: Plan, config: EngineConfig) -> None:
    if plan.over_budget:
        state = plan.state
        # only the open page is left in the active chapter
        assert state.first_active_page >= len(state.pages) - 1
        assert plan.estimated_tokens > plan.budget
    else:
        assert plan.estimated_tokens <= plan.budget


def tail_start(plan: Plan) -> int:
    """Start of the volatile tail: the message carrying volatile blocks, else a final user message (its
    volatile blocks may still come at a retry)."""
    for name, start, _end in plan.blocks:
        if name == "tail":
            return start
    if plan.messages and plan.messages[-1].get("role") == "user":
        return len(plan.messages) - 1
    return len(plan.messages)
