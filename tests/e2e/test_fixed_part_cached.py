"""An agent's fixed part (a long system prompt and many tools) stays cached across epochs: openai SDK -> proxy ->
emulator, whose radix cache renders the tools right after the system prompt (Qwen2.5's template)."""

from __future__ import annotations

from loadtests.workloads import agent_fixed

WINDOW = 16384


def test_epoch_turns_keep_the_agents_fixed_part_cached(emulator_and_proxy, client_for):
    pair = emulator_and_proxy(window=WINDOW)
    client = client_for(pair.proxy)
    workload = agent_fixed(turns=40, system_tokens=3000, tool_tokens=4500)
    messages: list[dict] = [{"role": "system", "content": workload.system},
                            {"role": "user", "content": workload.turns[0].user}]
    results = iter(workload.turns[0].tool_results)
    epoch = [0, 0]  # prompt, cached tokens of the epoch turns
    total = [0, 0]
    for n in range(39):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=list(workload.tools),
                                                               max_tokens=128)
        r = raw.parse()
        usage = (r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens)
        total = [total[0] + usage[0], total[1] + usage[1]]
        if raw.headers["x-memci-epoch"] == "true":
            epoch = [epoch[0] + usage[0], epoch[1] + usage[1]]
        calls = r.choices[0].message.tool_calls
        assert calls, f"request {n}: the scripted agent loop stopped"
        messages.append({"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]})
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": next(results)})
    assert epoch[0], "no epoch: the loop is too short for the window"
    assert epoch[1] / epoch[0] >= 0.55, epoch  # the system prompt and tools (~7.5k tokens) at least
    assert total[1] / total[0] >= 0.9, total
