"""A user message followed by hidden messages (a recall exchange spliced back) keeps the volatile blocks it had
when they were added, for good: the prompt before the hidden messages never changes, so they stay cached.

Regression of a property-test failure: after a regeneration, the blocks of the new request were attached to a
user message that spliced hidden messages then followed, inside the previous prompt's prefix."""

from engine_checks import check_tool_pairing, tail_start

from memci_proxy.engine import ConversationState, EngineConfig, EstimateCounter, TurnInput, add_hidden, plan

C = EstimateCounter()
SYSTEM = [{"role": "system", "content": "You are terse."}]
CFG = EngineConfig(context_window=20_000)


def exchange(call_id: str) -> list[dict]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "recall", "arguments": '{"query": "tea"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "page 1: tea is good " * 10},
    ]


def test_regeneration_after_a_hidden_exchange_keeps_the_user_message_unchanged() -> None:
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "what about tea?"}]
    p1 = plan(None, TurnInput(system=SYSTEM, messages=msgs), CFG, C)  # no volatile blocks
    state = add_hidden(p1.state, 2, exchange("r1"))
    # the client regenerates: the same request again, this time with blocks to add
    p2 = plan(state, TurnInput(system=SYSTEM, messages=msgs, memory="## Memory\n- likes tea", intent="tea"), CFG, C)
    keep = tail_start(p1)
    assert p2.messages[:keep] == p1.messages[:keep]
    assert p2.messages[3] == msgs[2]  # no blocks: it had none when the exchange was added
    state = add_hidden(p2.state, 2, exchange("r2"))
    p3 = plan(state, TurnInput(system=SYSTEM, messages=msgs, memory="## Memory\n- other"), CFG, C)
    assert p3.messages[: len(p2.messages)] == p2.messages
    assert p3.stable_prefix_messages == len(p2.messages)
    check_tool_pairing(p3.messages)


def test_blocks_seen_with_a_pushed_exchange_stay_on_later_turns() -> None:
    msgs = [{"role": "user", "content": "what did I tell you about tea?"}]
    p1 = plan(None, TurnInput(system=SYSTEM, messages=msgs, intent="tea preferences"), CFG, C)
    sent = [*p1.messages, *exchange("r1")]  # the exchange the upstream saw after the user message
    state = add_hidden(p1.state, 0, exchange("r1"))
    assert state.active_tokens - p1.state.active_tokens > sum(C.count_message(m) for m in exchange("r1"))
    msgs2 = msgs + [{"role": "assistant", "content": "You like it."}, {"role": "user", "content": "and coffee?"}]
    p2 = plan(state, TurnInput(system=SYSTEM, messages=msgs2, intent="coffee"), CFG, C)
    assert p2.messages[: len(sent)] == sent  # the whole pushed prompt is the next prefix
    assert p2.stable_prefix_messages == len(p1.messages)  # the plan's own prompt; the exchange came after it
    assert "coffee" in p2.messages[-1]["content"][-60:]
    msgs3 = msgs2 + [{"role": "assistant", "content": "No word on coffee."}, {"role": "user", "content": "ok"}]
    p3 = plan(p2.state, TurnInput(system=SYSTEM, messages=msgs3), CFG, C)
    assert p3.messages[: len(sent) + 1] == p2.messages[: len(sent) + 1]
    assert p3.stable_prefix_messages == len(sent) + 1  # up to the previous user message, which lost its blocks
    again = plan(ConversationState.from_bytes(p2.state.to_bytes()), TurnInput(system=SYSTEM, messages=msgs3), CFG, C)
    assert again.messages == p3.messages
