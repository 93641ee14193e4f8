import copy

from engine_checks import check_budget, check_pages, check_tool_pairing

from memci_proxy.engine import (
    ARCHIVED,
    EVICTED,
    ConversationState,
    EngineConfig,
    EstimateCounter,
    TurnInput,
    add_hidden,
    archived_pages,
    evicted_pages,
    observe_usage,
    page_entry_range,
    page_hidden_messages,
    plan,
    record_recall,
    split_leading_system,
)
from memci_proxy.engine.planner import watermarks
from memci_proxy.settings import load_settings

C = EstimateCounter()
SYSTEM = [{"role": "system", "content": "You are terse."}]
T0 = 1_763_769_600.0


def chat(turns: int, words: int = 60) -> list[dict]:
    msgs: list[dict] = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i} " + "word " * words})
        msgs.append({"role": "assistant", "content": f"answer {i} " + "text " * words})
    return msgs


def grow(config: EngineConfig, turns: int, state=None, words: int = 60, **turn_kw):
    """Plan a conversation turn by turn (continuing the one `state` was built from); returns the plans."""
    msgs: list[dict] = []
    first = 0
    if state is not None:
        msgs = _history_of([], state)
        first = len(msgs) // 2 + 1
        msgs.append({"role": "assistant", "content": f"answer {first - 1} " + "text " * words})
    plans = []
    for i in range(first, first + turns):
        msgs = msgs + [{"role": "user", "content": f"question {i} " + "word " * words}]
        p = plan(state, TurnInput(system=SYSTEM, messages=msgs, now=T0 + i, **turn_kw), config, C)
        plans.append(p)
        state = p.state
        msgs = msgs + [{"role": "assistant", "content": f"answer {i} " + "text " * words}]
    return plans


def test_layout_client_system_message_alone_then_the_memory_block_leading_the_conversation() -> None:
    msgs = [{"role": "user", "content": "hi", "x-extra": {"keep": True}}]
    before = copy.deepcopy(msgs)
    cfg = EngineConfig(context_window=10_000)
    p = plan(None, TurnInput(system=[{"role": "developer", "content": "Be brief."},
                                     {"role": "system", "content": [{"type": "text", "text": "Use SI units."}]}],
                             messages=msgs, profile="Profile: likes tea.", summary="Talked about tea."), cfg, C)
    assert p.messages[0] == {"role": "system", "content": "Be brief.\n\nUse SI units."}
    assert p.messages[1] == {"role": "user", "x-extra": {"keep": True}, "content": (
        "<memci-context>\nProfile: likes tea.\n\n## Conversation summary\nTalked about tea.\n</memci-context>\n\nhi")}
    assert msgs == before
    assert p.blocks == [("system", 0, 1), ("B6", 1, 2), ("B4", 1, 2)]
    plain = plan(None, TurnInput(system=SYSTEM, messages=msgs), cfg, C)
    assert plain.messages[1] is msgs[0]  # nothing of the proxy's: the conversation verbatim
    assert [e[0] for e in p.new_entries] == [0] and p.new_entries[0][2] == p.state.entry_hash_list()[0]


def test_no_system_message_when_there_is_nothing_to_say() -> None:
    p = plan(None, TurnInput(system=[], messages=[{"role": "user", "content": "hi"}]), EngineConfig(), C)
    assert p.messages == [{"role": "user", "content": "hi"}]


def test_split_leading_system() -> None:
    system, rest = split_leading_system([{"role": "system", "content": "a"}, {"role": "developer", "content": "b"},
                                         {"role": "user", "content": "c"}, {"role": "system", "content": "d"}])
    assert [m["content"] for m in system] == ["a", "b"] and [m["content"] for m in rest] == ["c", "d"]


def test_volatile_blocks_go_into_the_last_user_message_only_and_are_not_kept() -> None:
    cfg = EngineConfig(context_window=10_000)
    msgs = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]}]
    p = plan(None, TurnInput(system=SYSTEM, messages=msgs, task_state="step 2", intent="find X", memory="- fact"),
             cfg, C)
    last = p.messages[-1]
    assert last["content"][0] == {"type": "text", "text": "second"}
    assert last["content"][1] == {"type": "text", "text": "<memci-context>\n<task-state>\nstep 2\n</task-state>\n"
                                                          "<intent>\nfind X\n</intent>\n<memory>\n- fact\n</memory>\n"
                                                          "</memci-context>"}
    assert p.messages[1] is msgs[0] and msgs[2]["content"] == [{"type": "text", "text": "second"}]
    assert ("tail", 3, 4) in p.blocks
    msgs2 = msgs + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "third"}]
    p2 = plan(p.state, TurnInput(system=SYSTEM, messages=msgs2, intent="other"), cfg, C)
    assert p2.messages[3] is msgs[2]  # no longer carries last turn's blocks
    assert p2.messages[-1]["content"] == "third\n\n<memci-context>\n<intent>\nother\n</intent>\n</memci-context>"
    assert p2.stable_prefix_messages == 3


def test_volatile_blocks_stay_fixed_while_an_agent_loop_continues() -> None:
    cfg = EngineConfig(context_window=10_000)
    msgs = [{"role": "user", "content": "run it"}]
    p1 = plan(None, TurnInput(system=SYSTEM, messages=msgs, intent="run the job"), cfg, C)
    msgs = msgs + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    p2 = plan(p1.state, TurnInput(system=SYSTEM, messages=msgs, intent="something else"), cfg, C)
    assert p2.messages[:2] == p1.messages
    assert p2.stable_prefix_messages == 2


def test_prompt_is_append_only_between_epochs_and_epochs_bring_it_under_the_low_watermark() -> None:
    cfg = EngineConfig(context_window=6000, output_reserve=500, contents_budget_share=0.25, low_watermark=0.55)
    plans = grow(cfg, 40)
    epochs = [p for p in plans if p.epoch]
    assert epochs and all(p.epoch_reason == "high_watermark" for p in epochs)
    for prev, cur in zip(plans, plans[1:]):
        check_budget(cur, cfg)
        if not cur.epoch:
            assert cur.messages[: len(prev.messages)] == prev.messages  # no volatile blocks: no tail
            assert cur.stable_prefix_messages == len(prev.messages)
        else:
            fixed = C.count_message(SYSTEM[0])
            assert cur.estimated_tokens <= watermarks(cfg, cur.budget, fixed)[1]
            # the client's system message stays (and the tools a template renders after it)
            assert cur.archived and cur.stable_prefix_messages == 1
            assert cur.messages[0] == prev.messages[0] == {"role": "system", "content": SYSTEM[0]["content"]}
            assert cur.state.expected_cached_tokens == C.count_message(cur.messages[0])
            event = next(e for e in cur.events if e["type"] == "context.compressed")
            assert event["budget_tokens"] == cur.budget and event["archived"] == cur.archived
            assert event["compressed_count"] == len(cur.messages) < event["original_count"]
    assert "[Page 1] 2025-11-22, 2 messages" in epochs[0].messages[1]["content"]
    assert "`recall` tool" in epochs[0].messages[1]["content"]
    assert archived_pages(epochs[0].state)[0] == "1"


def test_watermarks_are_shares_of_the_room_above_the_fixed_part() -> None:
    cfg = EngineConfig(high_watermark=0.95, low_watermark=0.40)
    assert watermarks(cfg, 10_000, 0) == (9_500, 4_000)
    assert watermarks(cfg, 10_000, 6_000) == (6_000 + 0.95 * 4_000, 4_000)  # down to: every page but the open one
    assert watermarks(cfg, 10_000, 12_000) == (10_000, 4_000)  # no room: the budget itself


def test_a_large_fixed_part_does_not_make_every_turn_an_epoch() -> None:
    """An agent's fixed part (instructions and tools) of about 85% of the budget: an epoch starts at the fixed part
    plus 0.95 of the room above it and archives every page but the open one. With the high watermark a share of the
    whole budget, 0.95 of it, the same 60 turns had 16 epochs."""
    cfg = EngineConfig(context_window=12_000, output_reserve=1_000)
    budget = cfg.budget(None)
    system = [{"role": "system", "content": "rule " * int(0.558 * budget)}]
    tools_tokens = int(0.15 * budget)
    fixed = C.count_message({"role": "system", "content": system[0]["content"]}) + tools_tokens
    assert 0.8 * budget < fixed < 0.9 * budget
    msgs: list[dict] = []
    state, plans = None, []
    for i in range(60):
        msgs = msgs + [{"role": "user", "content": f"question {i} " + "word " * 30}]
        p = plan(state, TurnInput(system=system, messages=msgs, now=T0 + i, tools_tokens=tools_tokens), cfg, C)
        plans.append(p)
        state = p.state
        msgs = msgs + [{"role": "assistant", "content": f"answer {i} " + "text " * 30}]
    epochs = [p for p in plans if p.epoch]
    high, _ = watermarks(cfg, budget, fixed)
    assert 2 <= len(epochs) <= 8, len(epochs)
    assert all(prev.estimated_tokens <= high for prev, cur in zip(plans, plans[1:]) if cur.epoch)
    for prev, cur in zip(plans, plans[1:]):
        assert cur.estimated_tokens <= budget
        if cur.epoch:
            assert cur.estimated_tokens <= high and len(cur.state.pages) - cur.state.first_active_page <= 2
        else:
            assert cur.messages[: len(prev.messages)] == prev.messages


def test_budget_depends_on_max_tokens() -> None:
    cfg = EngineConfig(context_window=10_000, output_reserve=1000, safety_margin=0.1)
    assert cfg.budget(None) == 8000
    assert cfg.budget(2000) == 7000
    assert cfg.budget(3000) == 6500  # at most a quarter of the window is reserved
    p = plan(None, TurnInput(system=SYSTEM, messages=chat(1), max_tokens=2000), cfg, C)
    assert p.budget == 7000


def test_profile_and_summary_wait_for_an_epoch() -> None:
    cfg = EngineConfig(context_window=6000, output_reserve=500)
    msgs = chat(1)[:1]
    p1 = plan(None, TurnInput(system=SYSTEM, messages=msgs, profile="P1"), cfg, C)
    p2 = plan(p1.state, TurnInput(system=SYSTEM, messages=msgs + chat(2)[1:3], profile="P2"), cfg, C)
    assert "P1" in p2.messages[1]["content"] and "P2" not in p2.messages[1]["content"]
    # the client's own system prompt is followed at once
    p3 = plan(p2.state, TurnInput(system=[{"role": "system", "content": "New rules."}],
                                  messages=msgs + chat(2)[1:3], profile="P2"), cfg, C)
    assert p3.messages[0]["content"] == "New rules." and "P1" in p3.messages[1]["content"]
    assert p3.stable_prefix_messages == 0


def test_cold_cache_runs_a_pending_epoch() -> None:
    cfg = EngineConfig(context_window=6000, output_reserve=500, cache_ttl=300.0)
    plans = grow(cfg, 40)
    # a turn above the low watermark but under the high one, following a turn without an epoch
    state = next(p.state for prev, p in zip(plans, plans[1:])
                 if not p.epoch and not prev.epoch and 0.6 * p.budget < p.estimated_tokens < 0.8 * p.budget)
    messages = _history_of(plans, state) + [{"role": "user", "content": "n"}]
    warm = plan(state, TurnInput(system=SYSTEM, messages=messages, now=state.last_turn_time + 10), cfg, C)
    assert not warm.epoch
    cold = plan(state, TurnInput(system=SYSTEM, messages=messages, now=state.last_turn_time + 301), cfg, C)
    assert cold.epoch and cold.epoch_reason == "cold_cache" and cold.archived
    assert cold.estimated_tokens <= cfg.low_watermark * cold.budget
    # the upstream reporting far fewer cached tokens than the stable prefix it was sent counts as cold too
    assert state.expected_cached_tokens >= cfg.cold_cache_min_tokens
    fed = observe_usage(state, prompt_tokens=state.active_tokens, cached_tokens=0,
                        estimated_tokens=state.active_tokens, now=state.last_turn_time)
    short = plan(fed, TurnInput(system=SYSTEM, messages=messages, now=state.last_turn_time + 10), cfg, C)
    assert short.epoch_reason == "cold_cache"
    fine = observe_usage(state, prompt_tokens=state.active_tokens, cached_tokens=state.expected_cached_tokens,
                         estimated_tokens=state.active_tokens, now=state.last_turn_time)
    assert not plan(fine, TurnInput(system=SYSTEM, messages=messages, now=state.last_turn_time + 10), cfg, C).epoch


def _history_of(plans, state: ConversationState) -> list[dict]:
    msgs = []
    for i in range(state.entry_count):
        turn, kind = divmod(i, 2)
        msgs.append({"role": "user", "content": f"question {turn} " + "word " * 60} if kind == 0 else
                    {"role": "assistant", "content": f"answer {turn} " + "text " * 60})
    return msgs


def test_open_page_too_big_condenses_its_oldest_tool_outputs() -> None:
    cfg = EngineConfig(context_window=4000, output_reserve=500, condense_tool_chars=100, page_budget_share=2.0,
                       page_max_tokens=100_000, offload=False)  # one page larger than the budget
    msgs = [{"role": "user", "content": "analyse the logs"}]
    for i in range(6):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": "log line " * 300}]
    p = plan(None, TurnInput(system=SYSTEM, messages=msgs), cfg, C)
    assert not p.over_budget and p.epoch and p.condensed_count > 0
    check_budget(p, cfg)
    check_tool_pairing(p.messages)
    tools = [m for m in p.messages if m["role"] == "tool"]
    assert tools[0]["content"].endswith("chars]") and "…[cut " in tools[0]["content"]


def test_over_budget_is_flagged_and_never_the_request_unchanged() -> None:
    cfg = EngineConfig(context_window=2000, output_reserve=200, offload=False)
    msgs = [{"role": "user", "content": "x " * 8000}]
    p = plan(None, TurnInput(system=SYSTEM, messages=msgs), cfg, C)
    assert p.over_budget and p.estimated_tokens > p.budget
    assert ("passthrough", 0, 2) not in p.blocks and p.blocks[0] == ("system", 0, 1)
    assert p.state.last_upstream_count == len(p.messages)  # as planned: sent (a smaller answer) or refused
    assert not cfg.fits(p.estimated_tokens, None)  # not even a small answer fits: the caller refuses it
    assert any(e["type"] == "context.over_budget" for e in p.events)


def test_the_answer_reservation_is_at_most_a_share_of_the_window() -> None:
    cfg = EngineConfig(context_window=32768)  # Claude Code asks 32,000 answer tokens
    assert cfg.reserve(32000) == 8192 and cfg.budget(32000) == 32768 - 8192 - 3276
    assert cfg.reserve(1000) == 1000 and cfg.reserve(None) == 4096
    # the answer sent upstream: what the window leaves after the prompt and half the margin
    assert cfg.answer_tokens(32000, 15000) == 32768 - 1638 - 15000
    assert cfg.answer_tokens(1000, 15000) == 1000 and cfg.answer_tokens(None, 15000) is None
    # a prompt within the budget, grown by the recall rounds' half of the margin, leaves the reserve
    assert cfg.answer_tokens(32000, cfg.budget(32000) + 1638) == 8192
    assert EngineConfig(context_window=32768, output_reserve_share=0.5).reserve(32000) == 16384
    # over the budget, a prompt still goes while the margin and a 1,024-token answer (or the reserve) fit beside it
    assert cfg.fits(32768 - 1638 - 1024, 32000) and not cfg.fits(32768 - 1638 - 1023, 32000)
    assert cfg.fits(32768 - 1638 - 100, 100) and not cfg.fits(32768 - 1638 - 99, 100)
    assert cfg.answer_tokens(32000, 32768 - 1638 - 1024) == 1024  # what fits: the answer it leaves


def test_regenerate_and_edit_fork_the_conversation() -> None:
    cfg = EngineConfig(context_window=100_000)
    msgs = chat(3)
    p = plan(None, TurnInput(system=SYSTEM, messages=msgs), cfg, C)
    # regenerate: the last answer is gone
    regen = plan(p.state, TurnInput(system=SYSTEM, messages=msgs[:-1]), cfg, C)
    assert regen.forked_at == 5 and regen.dropped_pages == [] and regen.state.entry_count == 5
    check_pages(regen.state, msgs[:-1])
    # edit of the second question: pages 2 and 3 are dropped, page 2 is numbered again
    edited = [*msgs[:2], {"role": "user", "content": "another question"}]
    ed = plan(p.state, TurnInput(system=SYSTEM, messages=edited), cfg, C)
    assert ed.forked_at == 2 and ed.dropped_pages == ["2", "3"]
    assert [pg.label for pg in ed.state.pages] == ["1", "2"]
    assert [e[0] for e in ed.new_entries] == [2]
    check_pages(ed.state, edited)


def test_fork_inside_archived_pages_never_reuses_their_numbers() -> None:
    cfg = EngineConfig(context_window=6000, output_reserve=500, contents_budget_share=0.25, low_watermark=0.55)
    plans = grow(cfg, 30)
    state = plans[-1].state
    archived = archived_pages(state)
    assert len(archived) > 3
    history = _history_of(plans, state)
    cut = state.pages[2].start  # page 3 (archived) is replaced by another question
    edited = [*history[:cut], {"role": "user", "content": "a different question"}]
    p = plan(state, TurnInput(system=SYSTEM, messages=edited, now=T0 + 100), cfg, C)
    assert p.forked_at == cut
    check_pages(p.state, edited)
    assert archived_pages(p.state) == ["1", "2"]
    assert p.state.pages[-1].number > max(int(a) for a in archived)
    assert "[Page 3]" not in p.messages[0]["content"]


def test_hidden_messages_are_rendered_in_place_counted_and_archived_with_their_page() -> None:
    cfg = EngineConfig(context_window=100_000)
    msgs = [{"role": "user", "content": "what did we say about tea?"}]
    p1 = plan(None, TurnInput(system=SYSTEM, messages=msgs), cfg, C)
    hidden = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "r1", "type": "function", "function": {"name": "recall", "arguments": '{"pages": [1]}'}}]},
              {"role": "tool", "tool_call_id": "r1", "content": "page 1: tea is good " * 20}]
    state = add_hidden(p1.state, 0, hidden)
    assert state.active_tokens > p1.state.active_tokens
    assert p1.state.hidden == []  # not mutated
    msgs2 = msgs + [{"role": "assistant", "content": "We said tea is good."}, {"role": "user", "content": "thanks"}]
    p2 = plan(state, TurnInput(system=SYSTEM, messages=msgs2), cfg, C)
    assert [m["role"] for m in p2.messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert p2.messages[2]["tool_calls"][0]["id"] == "r1"
    assert p2.stable_prefix_messages == 2
    check_tool_pairing(p2.messages)
    assert page_hidden_messages(p2.state, 1) == [(0, hidden)]
    again = plan(ConversationState.from_bytes(p2.state.to_bytes()), TurnInput(system=SYSTEM, messages=msgs2), cfg, C)
    assert again.messages == p2.messages


def test_recall_statistics_feed_eviction_and_the_contents_page() -> None:
    cfg = EngineConfig(context_window=6000, output_reserve=500, evict_after_unrecalled=3, evict_after_unchanged=1000, contents_budget_share=0.25, low_watermark=0.55)
    plans = grow(cfg, 30)
    state = plans[-1].state
    first = archived_pages(state)
    assert "1" in first
    state = record_recall(state, ["1", 1, "#1"])
    assert state.pages[0].recall_count == 3 and state.pages[0].last_recalled_turn == state.turn
    kept = grow(cfg, 45, state=state)
    assert kept[-1].state.pages[0].status == ARCHIVED  # recalled: the never-recalled rule spares it
    assert all(label != "1" for p in kept for label, _rule in p.evicted)
    later = grow(cfg, 45)
    # without recalls, old entries leave the contents page but stay known to the state
    final = later[-1]
    evicted = evicted_pages(final.state)
    assert evicted and all(page_entry_range(final.state, e) is not None for e in evicted)
    assert any(rule == "unrecalled" for p in later for _label, rule in p.evicted)
    for label in evicted:
        assert f"[Page {label}]" not in final.messages[0]["content"]
    statuses = {pg.status for pg in final.state.pages}
    assert ARCHIVED in statuses and EVICTED in statuses


def test_contents_page_is_bounded_by_lru_eviction() -> None:
    cfg = EngineConfig(context_window=20_000, output_reserve=500, contents_max_tokens=300)
    plans = grow(cfg, 80, words=120)
    final = plans[-1]
    assert any(rule == "lru" for p in plans for _label, rule in p.evicted)
    contents = final.messages[1]["content"].split("## Contents of archived pages", 1)[1].split("</memci-context>")[0]
    assert C.count_text(contents) <= 300 + 20


def test_correction_ratio_moves_epochs_but_not_the_rendering() -> None:
    cfg = EngineConfig(context_window=8000, output_reserve=500)
    plans = grow(cfg, 6)
    state = plans[-1].state
    fed = observe_usage(state, prompt_tokens=plans[-1].estimated_tokens * 2, cached_tokens=None,
                        estimated_tokens=plans[-1].estimated_tokens, now=state.last_turn_time)
    assert 1.0 < fed.correction_ratio < 2.0
    assert fed.last_cached_tokens is None
    turn = TurnInput(system=SYSTEM, messages=_history_of(plans, state) + [{"role": "user", "content": "more"}],
                     now=state.last_turn_time + 1)
    a, b = plan(state, turn, cfg, C), plan(fed, turn, cfg, C)
    assert not a.epoch and not b.epoch and a.messages == b.messages
    assert b.estimated_tokens > a.estimated_tokens


def test_state_round_trip_plans_the_identical_prompt() -> None:
    cfg = EngineConfig(context_window=6000, output_reserve=500)
    plans = grow(cfg, 25, intent="x")
    state = plans[-1].state
    blob = state.to_bytes()
    assert ConversationState.from_bytes(blob) == state
    turn = TurnInput(system=SYSTEM, messages=_history_of(plans, state) + [{"role": "user", "content": "go on"}],
                     now=T0 + 99, intent="y")
    assert plan(ConversationState.from_bytes(blob), turn, cfg, C).messages == plan(state, turn, cfg, C).messages


def test_raw_messages_bytes_give_the_same_plan() -> None:
    import msgspec

    cfg = EngineConfig(context_window=6000, output_reserve=500)
    msgs: list[dict] = []
    state_a = state_b = None
    for i in range(20):
        msgs = msgs + [{"role": "user", "content": f"q{i} " + "w " * 100}]
        raw = msgspec.json.encode([*SYSTEM, *msgs])
        a = plan(state_a, TurnInput(system=SYSTEM, messages=msgs, now=T0 + i), cfg, C)
        b = plan(state_b, TurnInput(system=SYSTEM, messages=msgs, now=T0 + i, raw_messages=raw), cfg, C)
        assert a.messages == b.messages and a.forked_at == b.forked_at is None
        state_a, state_b = a.state, b.state
        msgs = msgs + [{"role": "assistant", "content": f"a{i} " + "v " * 100}]
    # an edit is still seen through the raw bytes
    edited = [{"role": "user", "content": "changed"}, *msgs[1:]]
    b = plan(state_b, TurnInput(system=SYSTEM, messages=edited, raw_messages=msgspec.json.encode([*SYSTEM, *edited])),
             cfg, C)
    assert b.forked_at == 0


def test_engine_config_from_settings() -> None:
    settings = load_settings(env={}, read_file=False, overrides={
        "active_high_watermark": 0.8, "active_low_watermark": 0.5, "page_max_tokens": 1000,
        "recall_tool_name": "memci_recall", "condense_tool_chars": 120})
    cfg = EngineConfig.from_settings(settings, context_window=65536)
    assert cfg.context_window == 65536 and cfg.high_watermark == 0.8 and cfg.low_watermark == 0.5
    assert cfg.page_max_tokens == 1000 and cfg.recall_tool_name == "memci_recall" and cfg.condense_tool_chars == 120
    assert cfg.output_reserve == settings.output_reserve and cfg.cache_ttl == settings.cache_ttl


def test_from_bytes_rejects_what_is_not_a_state_of_this_version() -> None:
    import msgspec
    import pytest

    with pytest.raises(ValueError):
        ConversationState.from_bytes(b"\x00junk")
    old = msgspec.msgpack.encode({"version": 1, "hashes": ["ab" * 16], "tokens": [3]})
    with pytest.raises(ValueError):
        ConversationState.from_bytes(old)


def test_the_parts_of_one_developer_message_keep_a_separator() -> None:
    from memci_proxy.engine.layout import system_message_text

    parts = [{"type": "text", "text": "<permissions instructions>a</permissions instructions>"},
             {"type": "text", "text": "<skills_instructions>b</skills_instructions>"}]
    text = system_message_text([{"role": "developer", "content": parts}, {"role": "system", "content": "c"}])
    assert text == ("<permissions instructions>a</permissions instructions>\n<skills_instructions>b"
                    "</skills_instructions>\n\nc")
