"""The client's fixed part (its system prompt and tools, as a chat template renders them) stays a byte-identical
prefix across epochs, under the templates of real engines: SmolLM2's (what llama.cpp and SGLang render for it) and
the Qwen2.5-style one of the emulator, which renders the tools right after the system prompt."""

from __future__ import annotations

import pytest

from memci_proxy.emulator.template import render_chat
from memci_proxy.engine import EngineConfig, EstimateCounter, TurnInput, plan

jinja2 = pytest.importorskip("jinja2")

# SmolLM2-135M-Instruct's chat template, as its tokenizer_config.json and GGUF ship it
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SYSTEM = [{"role": "system", "content": "You are a coding agent. " + "Follow the repository's rules. " * 40}]
TOOLS = [{"type": "function", "function": {"name": f"tool_{n}", "description": "Does a thing. " * 20,
                                           "parameters": {"type": "object", "properties": {}}}} for n in range(12)]
C = EstimateCounter()


def _smollm2(messages: list[dict]) -> str:
    return jinja2.Template(SMOLLM2).render(messages=messages, add_generation_prompt=True)


def _plans(turns: int = 40) -> list:
    cfg = EngineConfig(context_window=6000, output_reserve=500)
    msgs: list[dict] = []
    state, plans = None, []
    for i in range(turns):
        msgs = msgs + [{"role": "user", "content": f"question {i} " + "word " * 60}]
        p = plan(state, TurnInput(system=SYSTEM, messages=msgs, now=1_763_769_600.0 + i, tools_tokens=900), cfg, C)
        plans.append(p)
        state = p.state
        msgs = msgs + [{"role": "assistant", "content": f"answer {i} " + "text " * 60}]
    return plans


def test_the_fixed_part_stays_a_prefix_across_epochs_under_real_templates() -> None:
    plans = _plans()
    epochs = [(before, p) for before, p in zip(plans, plans[1:]) if p.epoch]
    assert len(epochs) >= 2 and any("Contents of archived pages" in str(p.messages) for _, p in epochs)
    system_turn = _smollm2(SYSTEM)[: -len("<|im_start|>assistant\n")]
    with_tools = render_chat(SYSTEM, TOOLS, add_generation_prompt=False)
    for before, p in epochs:
        for render, fixed in ((_smollm2, system_turn), (lambda m: render_chat(m, TOOLS), with_tools)):
            old, new = render(before.messages), render(p.messages)
            assert old.startswith(fixed) and new.startswith(fixed)  # the client's system prompt (and tools) first
            shared = len(fixed)
            assert new[:shared] == old[:shared]
            assert "Contents of archived pages" not in new[:shared]  # the proxy's blocks come after it
    for before, p in zip(plans, plans[1:]):  # between epochs the rendered prompt only grows at its end
        if not p.epoch:
            assert _smollm2(p.messages).startswith(_smollm2(before.messages)[: -len("<|im_start|>assistant\n")])


def test_an_agent_loop_whose_first_active_message_is_not_a_users_gets_the_memory_as_a_user_message() -> None:
    cfg = EngineConfig(context_window=4000, output_reserve=300, page_max_tokens=400)
    msgs: list[dict] = [{"role": "user", "content": "fix the tests"}]
    state, plans = None, []
    for n in range(40):
        msgs = msgs + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"output {n} " + "line " * 120}]
        p = plan(state, TurnInput(system=SYSTEM, messages=msgs, tools_tokens=900), cfg, C)
        plans.append(p)
        state = p.state
    led = [p for p in plans if p.epoch and p.messages[1]["role"] == "user" and
           p.messages[1]["content"].startswith("<memci-context>") and p.messages[2]["role"] == "assistant"]
    assert led, [p.messages[1]["role"] for p in plans if p.epoch]
    for p in led:
        assert ("B4", 1, 2) in p.blocks
        _smollm2([m if isinstance(m.get("content"), str) else {**m, "content": ""} for m in p.messages])
