"""Property tests of the context engine over random conversations: plain text, CJK, tool calls (parallel
too), huge outputs, edits and regenerations, hidden recall exchanges, varying max_tokens, idle gaps."""

from __future__ import annotations

import os
from typing import Any

from engine_checks import check_budget, check_no_loss, check_pages, check_tool_pairing, tail_start
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from memci_proxy.engine import (
    ARCHIVED,
    ConversationState,
    EngineConfig,
    EstimateCounter,
    TurnInput,
    add_hidden,
    observe_usage,
    plan,
    record_recall,
)

COUNTER = EstimateCounter()
WORDS = ["alpha", "beta", "gamma", "delta", "query", "index", "table", "join", "cache", "page", "数据库", "查询",
         "优化", "索引", "缓存", "页面", "ok", "the", "a", "of"]


def text(data: st.DataObject, low: int, high: int) -> str:
    n = data.draw(st.integers(low, high))
    seed = data.draw(st.integers(0, 10_000))
    return " ".join(WORDS[(seed + i * 7 + (i * i) % 5) % len(WORDS)] for i in range(n))


class Client:
    """A chat client replaying a conversation against the engine, the way an agent SDK does."""

    def __init__(self, data: st.DataObject, config: EngineConfig) -> None:
        self.data = data
        self.config = config
        self.history: list[dict[str, Any]] = []
        self.calls = 0
        self.now = 1_700_000_000.0

    def user(self) -> None:
        d = self.data
        kind = d.draw(st.sampled_from(["short", "short", "long", "parts", "huge"]))
        if kind == "parts":
            content: Any = [{"type": "text", "text": text(d, 1, 30)}, {"type": "text", "text": text(d, 1, 10)}]
        elif kind == "huge" and d.draw(st.integers(0, 9)) == 0:
            content = text(d, 2000, 4000)
        else:
            content = text(d, 1, 40 if kind == "short" else 300)
        self.history.append({"role": "user", "content": content, "x-client-field": 1})

    def assistant_turn(self) -> None:
        """One assistant step: a final text answer, or tool calls (maybe parallel) with their results."""
        d = self.data
        if d.draw(st.booleans()):
            msg: dict[str, Any] = {"role": "assistant", "content": text(d, 1, 120)}
            if d.draw(st.integers(0, 3)) == 0:
                msg["reasoning_content"] = text(d, 10, 200)
            self.history.append(msg)
            return
        n = d.draw(st.integers(1, 3))
        calls = []
        for _ in range(n):
            self.calls += 1
            calls.append({"id": f"call_{self.calls}", "type": "function",
                          "function": {"name": "search", "arguments": '{"q": "%s"}' % text(d, 1, 5)}})
        self.history.append({"role": "assistant", "content": None, "tool_calls": calls})
        for call in calls:
            size = d.draw(st.sampled_from([5, 50, 400, 1500]))
            self.history.append({"role": "tool", "tool_call_id": call["id"], "content": text(d, size // 2, size)})


@settings(
    max_examples=int(os.environ.get("ENGINE_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_engine_invariants_over_random_conversations(data: st.DataObject) -> None:
    config = EngineConfig(
        context_window=data.draw(st.integers(2500, 9000)),
        output_reserve=300,
        page_max_tokens=data.draw(st.integers(150, 900)),
        contents_max_tokens=data.draw(st.integers(150, 600)),
        evict_after_unrecalled=data.draw(st.integers(2, 12)),
        evict_after_unchanged=data.draw(st.integers(3, 20)),
        condense_tool_chars=60,
        condense_keep_pages=data.draw(st.integers(1, 3)),
        cache_ttl=100.0,
    )
    client = Client(data, config)
    system = [{"role": "system", "content": "You are a careful assistant."}]
    state: ConversationState | None = None
    previous = None
    system_changed = False
    for _step in range(data.draw(st.integers(3, 30))):
        action = data.draw(st.sampled_from(["user", "user", "user", "tool_loop", "edit", "regenerate"]))
        if action == "edit" and len(client.history) > 2:
            users = [i for i, m in enumerate(client.history) if m["role"] == "user"]
            cut = data.draw(st.sampled_from(users))
            del client.history[cut:]
            client.user()
        elif action == "regenerate" and client.history and client.history[-1]["role"] == "assistant":
            client.history.pop()
        elif action == "tool_loop" and client.history and client.history[-1]["role"] == "tool":
            pass  # the agent sends its tool results: the request ends with them
        else:
            client.user()
        if data.draw(st.integers(0, 15)) == 0:
            system = [{"role": "system", "content": "You are a careful assistant. " + text(data, 1, 5)}]
            system_changed = True
        client.now += data.draw(st.sampled_from([1.0, 5.0, 30.0, 500.0]))
        turn = TurnInput(
            system=system,
            messages=list(client.history),
            tools_tokens=data.draw(st.sampled_from([0, 50])),
            max_tokens=data.draw(st.sampled_from([None, 100, 500])),
            now=client.now,
            profile=data.draw(st.sampled_from(["", "User prefers short answers."])),
            summary=data.draw(st.sampled_from(["", "They discussed databases."])),
            intent=data.draw(st.sampled_from(["", "find the index advice"])),
            memory=data.draw(st.sampled_from(["", "## Memory\n- likes postgres"])),
        )
        result = plan(state, turn, config, COUNTER)
        for name, happened in (("epoch", result.epoch_reason), ("over budget", result.over_budget),
                               ("fork", result.forked_at is not None), ("eviction", result.evicted),
                               ("condensed", result.condensed_count), ("continuation", any(
                                   p.part > 1 for p in result.state.pages)), ("hidden", result.state.hidden)):
            if happened:
                event(f"{name}: {happened}" if name == "epoch" else name)

        # invariants of this turn
        check_pages(result.state, client.history)
        check_budget(result, config)
        check_no_loss(result, client.history, config)
        check_tool_pairing(result.messages)
        sent = result.messages
        assert sent[: result.stable_prefix_messages] == (previous.messages[: result.stable_prefix_messages]
                                                         if previous else [])
        # append-only between epochs
        if (previous is not None and not result.epoch and result.forked_at is None and not system_changed
                and not result.over_budget and not previous.over_budget):
            keep = tail_start(previous)
            assert sent[:keep] == previous.messages[:keep]
            assert result.stable_prefix_messages >= keep
        # a replica rebuilding the state from bytes plans the same prompt
        if state is not None:
            again = plan(ConversationState.from_bytes(state.to_bytes()), turn, config, COUNTER)
            assert again.messages == result.messages
            assert again.state.to_bytes() == result.state.to_bytes()
        new_indices = [e[0] for e in result.new_entries]
        assert new_indices == list(range(len(client.history) - len(new_indices), len(client.history)))
        system_changed = False

        # feedback the proxy gives back
        state = result.state
        prompt = sum(COUNTER.count_message(m) for m in sent)
        state = observe_usage(state, int(prompt * 1.2), data.draw(st.sampled_from([None, 0, prompt // 2])),
                              result.estimated_tokens, client.now)
        archived = [p.label for p in state.pages if p.status == ARCHIVED]
        if archived and data.draw(st.integers(0, 3)) == 0:
            state = record_recall(state, [data.draw(st.sampled_from(archived))])
        if client.history[-1]["role"] == "user" and not result.over_budget and data.draw(st.integers(0, 4)) == 0:
            client.calls += 1
            call_id = f"recall_{client.calls}"
            state = add_hidden(state, len(client.history) - 1, [
                {"role": "assistant", "content": None, "_hidden": True, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "recall", "arguments": '{"pages": [1]}'}}]},
                {"role": "tool", "tool_call_id": call_id, "_hidden": True, "content": text(data, 5, 200)},
            ])
        previous = result
        # the upstream answers
        if client.history[-1]["role"] in ("user", "tool"):
            client.assistant_turn()
