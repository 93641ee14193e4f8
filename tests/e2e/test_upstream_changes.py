"""The proxy follows what the upstream is, end to end (openai SDK -> proxy process -> emulator process):

- a window that follows the upstream: the emulator is restarted with a smaller --max-model-len while the proxy runs;
  the first turn after it is refused as too long, the proxy reads the window again, plans the turn for it and sends it
  once more: every turn answers, and none goes over the new window;
- a proxy-made message never breaks a conversation: an upstream that refuses tool calls and tool messages
  (`--refuse tool_messages`) gets the pushed recall round as text; the choice is remembered, so the next turns go
  through at the first try with the round's text byte for byte (their prefix stays cached).
"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import EmulatorProcess


def metric(proxy, name: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def chat(client, messages, text, max_tokens=400):
    messages.append({"role": "user", "content": text})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=max_tokens)
    r = raw.parse()
    messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return r, raw.headers


@pytest.fixture(scope="module")
def restartable(emulator_and_proxy):
    emu = EmulatorProcess(["--max-model-len", "32768"]).start()
    pair = emulator_and_proxy(emulator=emu)  # the proxy learns the window from the emulator's /v1/models
    yield pair
    emu.stop()


def test_the_window_follows_an_upstream_restarted_with_a_smaller_one(restartable):
    emu, proxy = restartable.emulator, restartable.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-window", max_retries=0, timeout=30)
    messages: list[dict] = []
    for turn in range(1, 21):
        r, headers = chat(client, messages, f"Turn {turn}: tell me about the harbour. [[len:300]]")
    assert r.usage.prompt_tokens > 6000 and headers["x-memci-pages-archived"] == "0"  # planned for 32768

    emu.stop()
    emu.args = ["--max-model-len", "4096"]
    emu.start()  # the same port, a smaller window
    for turn in range(21, 31):
        r, headers = chat(client, messages, f"Turn {turn}: and about the lighthouse. [[len:300]]")
        assert r.usage.prompt_tokens + 400 <= 4096
    assert int(headers["x-memci-pages-archived"]) > 0
    assert metric(proxy, 'memci_turn_resends_total{why="window"}') == 1  # once: later turns plan for 4096
    assert "context window is now 4096 tokens" in proxy.log()
    client.close()


@pytest.fixture(scope="module")
def refusing(emulator_and_proxy):
    return emulator_and_proxy(4096, emulator_args=["--refuse", "tool_messages"])


def test_an_upstream_that_refuses_the_pushed_round_gets_it_as_text(refusing):
    emu, proxy = refusing.emulator, refusing.proxy
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-shapes", max_retries=0, timeout=30)
    messages: list[dict] = []
    for turn in range(1, 45):
        text = {3: "Please remember: my gym locker code is 4817."}.get(
            turn, f"Chit-chat number {turn} about the weather and the news.")
        _, headers = chat(client, messages, text + " [[len:80]]", max_tokens=200)
    assert int(headers["x-memci-pages-archived"]) >= 3  # turn 3 has left the prompt

    chat(client, messages, "Do you remember my gym locker code?", max_tokens=200)
    (sent,) = emu.requests(1)
    last = sent["body"]["messages"][-1]
    assert last["role"] == "assistant" and "4817" in last["content"] and "tool_calls" not in last
    assert not any(m["role"] == "tool" or m.get("tool_calls") for m in sent["body"]["messages"])
    assert metric(proxy, 'memci_turn_resends_total{why="rounds"}') == 1
    assert metric(proxy, 'memci_recall_pushes_total{outcome="pushed"}') == 1

    pushed_prompt = sent["body"]["messages"]
    r, headers = chat(client, messages, "Thanks. More chit-chat about the news. [[len:80]]", max_tokens=200)
    (nxt,) = emu.requests(1)
    assert headers["x-memci-epoch"] == "false" and nxt["body"]["messages"][: len(pushed_prompt)] == pushed_prompt
    assert nxt["cached_tokens"] / nxt["prompt_tokens"] >= 0.9
    assert metric(proxy, 'memci_turn_resends_total{why="rounds"}') == 1  # remembered: no refusal again
    client.close()
