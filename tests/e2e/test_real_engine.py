"""The proxy in front of a real engine (tests/e2e/real_engine.py: llama-cpp-python's server, SmolLM2-135M-Instruct,
n_ctx 2048, one cache slot), through the official openai SDK, the memory workers on.

A 60-turn chat: a fact stated at turn 2, looked up in plain words at turn 40 (the proxy pushes a recall round: an
assistant tool call and its result, kept in the history from then on), and 20 turns after it. Every turn answers;
no prompt goes over n_ctx; the proxy counts with the engine's /extras/tokenize; and the engine's own prefix reuse
(its log) reaches 0.95 of the ceiling 1 - 2d/H, summary and profile jobs included (on a one-slot engine they run
before the epoch's request, on the prefix the slot holds: `upstream_cache`, detected).

Skipped when the build script is not there (`../shared/tools/real-llm.sh`, or MEMCI_REAL_LLM_SCRIPT). The first run
builds the engine (about 6-10 minutes); later runs reuse ~/.cache/memci-real-llm. Figures are printed (-s).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.proxyproc import ProxyProcess
from tests.e2e.scripted_chat import FACTS, LOOK_UP, LOOK_UP_TURN, TOPICS, metric
from tests.e2e.real_engine import RealEngine, build, build_script, ceiling, engine_reuse, reuse_ratio

N_CTX = 2048
MAX_TOKENS = 24  # ~50 tokens/s generated with one thread: a 60-turn chat in about two minutes
ADMIN = "admin-real"
def user_text(turn: int) -> str:
    if turn in FACTS:
        return FACTS[turn]
    if turn == LOOK_UP_TURN:
        return LOOK_UP
    if turn == LOOK_UP_TURN + 1:
        return "Thanks. Now tell me about maple trees."
    return f"Turn {turn}: tell me one short fact about {TOPICS[turn % len(TOPICS)]}."


@pytest.fixture(scope="module")
def engine():
    script = build_script()
    if script is None:
        pytest.skip("the real engine's build script (../shared/tools/real-llm.sh) is not there")
    directory = build(script)
    home = Path(tempfile.mkdtemp(prefix="memci-real-engine-"))
    eng = RealEngine(directory, home / "engine.log", n_ctx=N_CTX).start()
    yield eng
    eng.stop()
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def proxy(engine):
    home = Path(tempfile.mkdtemp(prefix="memci-real-proxy-"))
    p = ProxyProcess(engine.base_url, home, {
        "MEMCI_MEMORY_WORKERS": "true", "MEMCI_CONTEXT_WINDOW": str(N_CTX), "MEMCI_ADMIN_KEY": ADMIN,
    }).start()
    yield p
    p.stop()
    shutil.rmtree(home, ignore_errors=True)


def test_sixty_turns_with_a_pushed_recall_round(engine, proxy):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-real", max_retries=0, timeout=300)
    start = len(engine.log())
    messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant. Answer in one sentence."}]
    prompts: list[int] = []
    epochs: list[bool] = []
    errors: list[str] = []
    conversation = ""
    pushed_prompt: list[dict] = []
    for turn in range(1, 61):
        messages.append({"role": "user", "content": user_text(turn)})
        try:
            raw = client.chat.completions.with_raw_response.create(model="smollm2", messages=messages,
                                                                   max_tokens=MAX_TOKENS, temperature=0)
        except openai.APIError as exc:
            errors.append(f"turn {turn}: {exc}")
            messages.append({"role": "assistant", "content": "(no answer)"})
            continue
        r = raw.parse()
        conversation = raw.headers["x-memci-conversation-id"]
        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})
        prompts.append(r.usage.prompt_tokens)
        epochs.append(raw.headers["x-memci-epoch"] == "true")
        if turn == LOOK_UP_TURN:
            view = httpx.get(f"{proxy.url}/memci/conversations/{conversation}/prompt",
                             headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).json()
            pushed_prompt = view["messages"]
    client.close()
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    calls = engine_reuse(engine.log()[start:])
    reuse = reuse_ratio(calls)
    best, d, h = ceiling(prompts, epochs)
    print(f"\nreal engine, {len(prompts)} turns at n_ctx {N_CTX}: errors {len(errors)}, max prompt {max(prompts)}, "
          f"epochs {sum(epochs)}, engine calls {len(calls)} (turns {len(prompts)}, cold "
          f"{sum(c.reused < c.evaluated for c in calls)}), reuse {reuse:.4f}, "
          f"ceiling {best:.4f} (d {d:.1f}, H {h}), ratio {reuse / best:.4f}; summary calls "
          f"{metric(text, 'memci_summary_calls_total')}, tokenize "
          f"{metric(text, 'memci_tokenize_requests_total')}")
    assert not errors, errors
    assert max(prompts) <= N_CTX
    # turn 40: the pushed round (an assistant call of recall and its result, holding the fact) went upstream
    assert [m["role"] for m in pushed_prompt[-3:]] == ["user", "assistant", "tool"], pushed_prompt[-3:]
    assert "4817" in pushed_prompt[-1]["content"]
    assert metric(text, 'memci_recall_pushes_total{outcome="pushed"}') >= 1
    assert metric(text, "memci_turn_resends_total") == 0  # content "" beside tool_calls: taken at the first try
    assert sum(epochs) >= 1 and metric(text, "memci_summary_calls_total") >= 1  # the workers ran
    assert re.search(r'memci_tokenize_requests_total\{outcome="ok"\} [1-9]', text), "no /extras/tokenize"
    # no request after a memory job prefills the conversation again: the only cold calls (less reused than
    # evaluated) are the first one and the epochs' own (a job sent after the answer would add two per epoch: itself,
    # and the next turn)
    cold = [c for c in calls if c.reused < c.evaluated]
    assert len(cold) <= 1 + sum(epochs), cold
    assert reuse >= 0.95 * best, (reuse, best)
