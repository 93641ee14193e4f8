"""A Claude-Code-shaped agent on a small window, end to end: the openai and anthropic SDKs -> proxy -> an emulator
that refuses prompt + max_tokens over its window, as vLLM and SGLang do.

The agent carries about 14k tokens of system prompt and tools, asks max_tokens 32000 on a 32k window, and runs 60
rounds of 2-6 KB tool outputs under one user message. The proxy plans the prompt with at most a quarter of the window
reserved for the answer and lowers the max_tokens it sends so that every upstream request fits; pages are archived
as the loop grows."""

from __future__ import annotations

import random
import re

import anthropic
import httpx
import pytest

from memci_proxy.prompt_view import fetch_prompt, render


def metric_value(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0

WINDOW = 32768
ROUNDS = 60
ASKED = 32000
WORDS = ("file", "path", "module", "function", "returns", "value", "config", "error", "handler", "request", "token",
         "session", "cache", "buffer", "index", "query", "parser", "stream", "worker", "schema", "record", "field")


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def tool_specs(rng: random.Random) -> list[tuple[str, str, dict]]:
    """About 9k emulator tokens of tools (16 tools): (name, description, JSON schema)."""
    specs = []
    for n in range(16):
        params = {"type": "object", "properties": {
            f"arg_{k}": {"type": "string", "description": prose(rng, 40)} for k in range(3)}, "required": ["arg_0"]}
        specs.append((f"tool_{n}", prose(rng, 90), params))
    return specs


def tool_output(rng: random.Random, round_no: int) -> str:
    """2-6 KB of source listing; its first line makes the emulator call the next tool."""
    lines = [f'[[call:tool_{round_no % 16} {{"arg_0": "step {round_no + 1}"}}]] listing {round_no}']
    size = rng.randint(2000, 6000)
    while sum(len(x) + 1 for x in lines) < size:
        lines.append(f"    def handler_{len(lines)}(self, request): return self.{rng.choice(WORDS)}"
                     f"({rng.choice(WORDS)}={len(lines) * 7})")
    return "\n".join(lines)


SYSTEM_TEXT = "You are an interactive coding agent. " + prose(random.Random(7), 2400)


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW, env={"MEMCI_ADMIN_KEY": "admin-key"})


def within_the_window(emu) -> list[dict]:
    """The emulator's logged requests since its reset; each one fits the window with its max_tokens."""
    logged = emu.requests(200)
    for entry in logged:
        body = entry["body"]
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        assert entry["prompt_tokens"] + asked <= WINDOW, (entry["prompt_tokens"], asked)
    return logged


def check_the_run(pair, last_headers, logged: list[dict]) -> None:
    assert len(logged) >= ROUNDS
    assert max(entry["prompt_tokens"] for entry in logged) > 14_000 + 4_000  # the loop did fill the window
    assert min(entry["prompt_tokens"] for entry in logged) > 14_000  # the fixed part: about 14k tokens
    lowered = [e for e in logged if (e["body"].get("max_completion_tokens") or e["body"].get("max_tokens")) < ASKED]
    assert len(lowered) == len(logged)  # 32000 never fits with a 14k fixed part
    assert int(last_headers["x-memci-pages-archived"]) > 0
    assert int(last_headers["x-memci-max-tokens-lowered"]) < ASKED
    # inspect says what was sent: the answer's size asked and sent
    view = fetch_prompt(pair.proxy.url, last_headers["x-memci-conversation-id"], "admin-key")
    assert view["accounting"]["max_tokens_asked"] == ASKED
    assert view["accounting"]["max_tokens_sent"] == int(last_headers["x-memci-max-tokens-lowered"])
    assert f"(lowered from {ASKED:,} to fit the window)" in render(view, color=False)
    metrics = httpx.get(pair.proxy.url + "/metrics", timeout=10).text
    assert metric_value(metrics, "memci_max_tokens_lowered_total") >= ROUNDS
    assert metric_value(metrics, "memci_over_budget_total") == 0


def test_sixty_rounds_on_chat_completions(pair, client_for):
    pair.emulator.reset()
    rng = random.Random(1)
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
             for n, d, p in tool_specs(rng)]
    client = client_for(pair.proxy)
    messages = [{"role": "system", "content": SYSTEM_TEXT},
                {"role": "user", "content": 'Fix the failing tests. [[call:tool_0 {"arg_0": "step 0"}]]'}]
    headers = None
    for round_no in range(ROUNDS):
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, tools=tools,
                                                               max_tokens=ASKED)
        answer, headers = raw.parse(), raw.headers
        calls = answer.choices[0].message.tool_calls
        assert calls, f"round {round_no}: the model answered {answer.choices[0].message.content!r}"
        messages.append(answer.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": tool_output(rng, round_no + 1)})
    check_the_run(pair, headers, within_the_window(pair.emulator))


def test_sixty_rounds_on_messages(pair):
    pair.emulator.reset()
    rng = random.Random(2)
    tools = [{"name": n, "description": d, "input_schema": p} for n, d, p in tool_specs(rng)]
    client = anthropic.Anthropic(base_url=pair.proxy.url, api_key="sk-ant-test", max_retries=0, timeout=60)
    messages: list[dict] = [{"role": "user", "content": 'Fix the failing tests. [[call:tool_0 {"arg_0": "step 0"}]]'}]
    headers = None
    for round_no in range(ROUNDS):
        raw = client.messages.with_raw_response.create(model="m", system=SYSTEM_TEXT, messages=messages, tools=tools,
                                                       max_tokens=ASKED)
        answer, headers = raw.parse(), raw.headers
        uses = [b for b in answer.content if b.type == "tool_use"]
        assert answer.stop_reason == "tool_use" and uses, f"round {round_no}: {answer.content}"
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                      "content": tool_output(rng, round_no + 1)}]})
    client.close()
    check_the_run(pair, headers, within_the_window(pair.emulator))


@pytest.fixture(scope="module")
def pair16(emulator_and_proxy):
    return emulator_and_proxy(16384)


def test_a_codex_shaped_session_on_a_16k_window(pair16, client_for):
    """Codex's shape through the Responses API: instructions and tools of about 6k tokens, a developer message of
    tagged parts, the whole input resent each turn, no max_output_tokens; 40 rounds of 2-6 KB tool outputs on a
    strict 16k window: every request within the window, epochs real (pages archived), nothing passed through."""
    pair16.emulator.reset()
    rng = random.Random(3)
    tools = [{"type": "function", "name": n, "description": d, "parameters": p} for n, d, p in tool_specs(rng)[:6]]
    client = client_for(pair16.proxy)
    items: list[dict] = [
        {"type": "message", "role": "developer", "content": [
            {"type": "input_text", "text": "<permissions instructions>sandbox: workspace-write</permissions instructions>"},
            {"type": "input_text", "text": "<skills_instructions>none</skills_instructions>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "<environment_context>cwd: /repo</environment_context>"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": 'Fix the failing tests. [[call:tool_0 {"arg_0": "step 0"}]]'}]}]
    headers = None
    for round_no in range(40):
        raw = client.responses.with_raw_response.create(model="m", instructions=SYSTEM_TEXT[:12_000], input=items,
                                                        tools=tools, store=False)
        answer, headers = raw.parse(), raw.headers
        calls = [o for o in answer.output if o.type == "function_call"]
        assert calls, f"round {round_no}: {answer.output}"
        items += [o.model_dump(exclude_none=True) for o in answer.output]
        items.append({"type": "function_call_output", "call_id": calls[0].call_id,
                      "output": tool_output(rng, (round_no + 1) % 6)})
    logged = pair16.emulator.requests(200)
    assert len(logged) >= 40
    assert all(e["prompt_tokens"] + (e["body"].get("max_tokens") or 0) <= 16384 for e in logged)
    assert all(m["role"] != "developer" for e in logged for m in e["body"]["messages"])  # B1: one system message
    first = logged[0]["body"]["messages"][0]["content"]
    assert "</permissions instructions>\n<skills_instructions>" in first
    assert int(headers["x-memci-pages-archived"]) > 0
    metrics = httpx.get(pair16.proxy.url + "/metrics", timeout=10).text
    assert metric_value(metrics, "memci_over_budget_total") == 0
