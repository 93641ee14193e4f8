"""cache_bench against a real model that calls no tool: the agent loop goes on with the calls its script names."""

from __future__ import annotations

from loadtests.cache_bench import scripted_call_message
from loadtests.workloads import make_workload


def test_the_scripted_call_is_the_one_the_emulator_would_make() -> None:
    workload = make_workload("agent", turns=4)
    turn = workload.turns[0]
    history = [{"role": "system", "content": workload.system}, {"role": "user", "content": turn.user}]
    first = scripted_call_message(history, 1)
    assert first is not None and first["content"] == "" and len(first["tool_calls"]) == 1
    call = first["tool_calls"][0]
    assert call["function"]["name"] in {t["function"]["name"] for t in workload.tools}
    history += [first, {"role": "tool", "tool_call_id": call["id"], "content": turn.tool_results[0]}]
    second = scripted_call_message(history, 2)  # the next call's marker leads the tool's output
    assert second is not None and second["tool_calls"][0]["id"] != call["id"]
    history += [second, {"role": "tool", "tool_call_id": "x", "content": "All tests pass now."}]
    assert scripted_call_message(history, 3) is None
