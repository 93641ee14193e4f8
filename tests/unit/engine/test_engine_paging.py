from engine_checks import check_pages

from memci_proxy.engine import EngineConfig, EstimateCounter, TurnInput, page_entry_range, plan

COUNTER = EstimateCounter()


def run(messages, **config):
    cfg = EngineConfig(context_window=1_000_000, **config)
    return plan(None, TurnInput(system=[], messages=messages, now=0.0), cfg, COUNTER).state


def tool_round(i: int, size: int = 400) -> list[dict]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": f"c{i}b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": f"c{i}a", "content": "r" * size},
        {"role": "tool", "tool_call_id": f"c{i}b", "content": "s" * size},
    ]


def test_pages_follow_user_messages_and_messages_before_the_first_user_belong_to_page_1() -> None:
    msgs = [{"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
            {"role": "system", "content": "note"},
            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    state = run(msgs)
    check_pages(state, msgs)
    assert [(p.label, p.start, p.end) for p in state.pages] == [("1", 0, 4), ("2", 4, 6)]
    assert page_entry_range(state, 2) == (4, 6)
    assert page_entry_range(state, "#1") == (0, 4)
    assert page_entry_range(state, 9) is None


def test_large_pages_split_into_continuations_at_assistant_boundaries() -> None:
    msgs = [{"role": "user", "content": "do the task"}]
    for i in range(6):
        msgs += tool_round(i)
    msgs.append({"role": "assistant", "content": "done"})
    msgs.append({"role": "user", "content": "thanks"})
    state = run(msgs, page_max_tokens=300)
    check_pages(state, msgs)
    labels = [p.label for p in state.pages]
    assert labels[0] == "1" and labels[-1] == "2"
    assert labels[1:4] == ["1.2", "1.3", "1.4"]
    for p in state.pages:
        assert msgs[p.start]["role"] in ("user", "assistant")
    assert page_entry_range(state, "1.2") == (state.pages[1].start, state.pages[1].end)
    assert page_entry_range(state, 1.2) == page_entry_range(state, "1.2")
