"""Intent rewrite (B2b) and memory injection (B5) end to end, and the model level's time-out fallback."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.e2e.conftest import EmulatorProcess


@pytest.fixture(scope="module")
def slow_model():
    """A rewrite model that needs about a second per request (1 ms per uncached prompt token)."""
    e = EmulatorProcess(["--per-uncached-token", "0.01"]).start()
    yield e
    e.stop()


@pytest.fixture(scope="module")
def pair(emulator_and_proxy, slow_model):
    return emulator_and_proxy(4096, {
        "MEMCI_REWRITE_MODEL_URL": slow_model.base_url, "MEMCI_REWRITE_MODEL": "small",
        "MEMCI_REWRITE_TIMEOUT_MS": "300", "MEMCI_MEMORY_INJECTION_ENABLED": "true",
    })


def last_user_sent(emu) -> str:
    return emu.turn_requests(1)[0]["body"]["messages"][-1]["content"]


def test_rewritten_intent_goes_next_to_the_users_words(proxy, emu):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-intent", max_retries=0)
    messages = [
        {"role": "user", "content": "我想了解长城 [[len:10]]"},
        {"role": "assistant", "content": "长城是中国古代的军事防御工程。"},
        {"role": "user", "content": "它有多长？ [[len:10]]"},
    ]
    client.chat.completions.create(model="m", messages=messages, max_tokens=50, extra_headers={"X-Memci-Rewrite": "rules"})
    sent = last_user_sent(emu)
    assert sent.startswith("它有多长？ [[len:10]]")  # the client's words first, unchanged
    assert "<memci-context>" in sent and "Standalone intent: 长城有多长？" in sent
    text = httpx.get(proxy.url + "/metrics").text
    assert 'memci_intent_rewrite_total{level="rules",reason="disabled"}' in text


def test_slow_model_falls_back_to_rules_within_the_timeout(proxy, emu):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-slow", max_retries=0)
    messages = [
        {"role": "user", "content": "Tell me about the Eiffel Tower. [[len:10]]"},
        {"role": "assistant", "content": "The Eiffel Tower is a wrought-iron tower in Paris."},
        {"role": "user", "content": "What about the Louvre? [[len:10]]"},
    ]
    client.chat.completions.create(model="m", messages=messages[:1], max_tokens=20, extra_headers={"X-Memci-Rewrite": "off"})
    started = time.perf_counter()
    client.chat.completions.create(model="m", messages=messages, max_tokens=20, extra_headers={"X-Memci-Rewrite": "off"})
    baseline = time.perf_counter() - started
    started = time.perf_counter()
    client.chat.completions.create(model="m", messages=messages, max_tokens=20, extra_headers={"X-Memci-Rewrite": "model"})
    with_model = time.perf_counter() - started
    assert with_model <= baseline + 0.300 + 0.050 + 0.05, (with_model, baseline)  # + scheduling slack on 2 cores
    assert "Standalone intent: " in last_user_sent(emu)
    text = httpx.get(proxy.url + "/metrics").text
    assert 'memci_intent_rewrite_total{level="rules",reason="timeout"}' in text


def test_memory_from_archived_pages_is_injected(proxy, emu):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-memory", max_retries=0)
    messages: list[dict] = []
    for turn in range(1, 60):
        text = "My favourite violinist is Hilary Hahn." if turn == 2 else f"Small talk {turn} about lunch."
        messages.append({"role": "user", "content": text + " [[len:60]]"})
        r = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=100,
                                                             extra_headers={"X-Memci-Rewrite": "rules"})
        messages.append({"role": "assistant", "content": r.parse().choices[0].message.content})
    assert int(r.headers["x-memci-pages-archived"]) > 10
    messages.append({"role": "user", "content": "Which violinist do I like? [[len:5]]"})
    client.chat.completions.create(model="m", messages=messages, max_tokens=20, extra_headers={"X-Memci-Rewrite": "rules"})
    sent = last_user_sent(emu)
    assert "## Memory" in sent and "[page 2]" in sent and "Hilary Hahn" in sent
    messages.append({"role": "assistant", "content": "ok"})
    messages.append({"role": "user", "content": "Which violinist do I like? [[len:5]]"})
    client.chat.completions.create(model="m", messages=messages, max_tokens=20,
                                   extra_headers={"X-Memci-Memory": "off", "X-Memci-Rewrite": "off"})
    assert "<memci-context>" not in last_user_sent(emu)


def test_by_default_the_intent_line_only_comes_with_memory(proxy, emu):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-default", max_retries=0)
    messages = [
        {"role": "user", "content": "我想了解长城 [[len:10]]"},
        {"role": "assistant", "content": "长城是中国古代的军事防御工程。"},
        {"role": "user", "content": "它有多长？ [[len:10]]"},
    ]
    client.chat.completions.create(model="m", messages=messages, max_tokens=50)
    assert last_user_sent(emu) == "它有多长？ [[len:10]]"  # nothing archived, nothing to add: append-only


def test_rewrite_api(proxy):
    body = {"messages": [{"role": "user", "content": "我想了解长城"}, {"role": "assistant", "content": "长城是工程。"},
                         {"role": "user", "content": "它有多长？"}], "mode": "rules"}
    r = httpx.post(proxy.url + "/memci/rewrite", json=body, timeout=10)
    assert r.status_code == 200
    assert r.json() == {"query": "长城有多长？", "level": "rules", "changed": True, "reason": "disabled"}
    bad = httpx.post(proxy.url + "/memci/rewrite", json={"messages": []}, timeout=10)
    assert bad.status_code == 400
