"""Hostile input against a running proxy (PostgreSQL, Redis, the emulator): a clear OpenAI-style 4xx or a bounded
cost, never a 5xx or a hang.

Each case is timed against a reference measured in the same test: the same request a tenth of the size (a
linear cost grows ~10x, a quadratic one ~100x: the bound is 30x), or an ordinary request for the cases that
must stay as cheap as one. The intent rules and memory injection are on, so hostile text reaches their regexes.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import httpx
import pytest

from tests.resilience.conftest import assert_openai_error

SYSTEM = {"role": "system", "content": "You are terse."}
HEADERS = {"Authorization": "Bearer sk-hostile-0001", "X-Memci-Rewrite": "rules", "X-Memci-Memory": "on"}
TIMEOUT = 300.0  # never a hang: every request must answer well inside this


@pytest.fixture
def hostile(redis_proc, migrated_db_url, home, start_proxy):
    proxy = start_proxy(home / "p", {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url,
                                     "MEMCI_MEMORY_INJECTION_ENABLED": "true"})
    client = httpx.Client(timeout=TIMEOUT)
    yield proxy, client
    client.close()


def timed(client: httpx.Client, url: str, body: Any = None, content: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    r = client.post(url, json=body, content=content, headers={**HEADERS, **(headers or {})})
    took = time.perf_counter() - started
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert_openai_error(r)
    return r, took


def chat(messages: list[dict], **extra: Any) -> dict:
    return {"model": "m", "messages": [SYSTEM, *messages], "max_tokens": 16, **extra}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def tiny_messages(count: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(count - 1)] + [
        user("end [[len:5]]")]


def tools(count: int) -> list[dict]:
    return [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing " * 5,
             "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}} for i in range(count)]


def tool_result(size: int) -> dict:
    return chat([user("run it"), {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "tool_0", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "result line\n" * (size // 12)}], tools=tools(1))


def test_hostile_requests_get_a_4xx_or_cost_a_bounded_multiple_of_their_reference(hostile):
    proxy, client = hostile
    url = proxy.url + "/v1/chat/completions"
    history = [user("Tell me about the Eiffel Tower in Paris. [[len:20]]"),
               {"role": "assistant", "content": "It is a wrought-iron lattice tower built in 1889."}]
    ordinary = statistics.median(timed(client, url, chat([*history, user(f"How tall is it {i}? [[len:10]]")]))[1]
                                 for i in range(5))
    report: dict[str, Any] = {"ordinary_s": round(ordinary, 4)}

    # -- catastrophic-backtracking probes, through the intent rules, memory injection, recall and search --------
    probes = {
        "what-about, spaces": "what about a" + " " * 1980 + "b too?",
        "what-else, spaces": "what else" + " " * 1980 + "?",
        "word_ that": "a" * 1980 + "_ that is it?",
        "pronouns": ("it its they them this is that is " * 80)[:1990],
        "cjk pronouns": ("它呢那个是这是" * 300)[:1990],
        "tags and pages": ("<memci-context [page 1 #" * 100)[:1990],
    }
    session = {"X-Session-Id": "hostile-probes"}
    for name, text in probes.items():
        _, took = timed(client, url, chat([*history, user(text + " [[len:10]]")]), headers=session)
        r, search_took = timed(client, proxy.url + "/memci/search", {"query": text, "session_key": "hostile-probes"})
        assert r.status_code == 200
        report[name] = round(took, 3)
        assert took < 25 * ordinary + 0.5 and search_took < 25 * ordinary + 0.5, (name, took, search_took, ordinary)
    query = json.dumps({"query": probes["what-about, spaces"]})
    _, took = timed(client, url, chat([*history, user(f"recall [[call:recall {query}]]")]))
    assert took < 25 * ordinary + 0.5

    # -- deeply nested JSON: a 400 at once ------------------------------------------------------------------------
    for depth in (300, 1_000, 100_000):
        nested = (b'{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"metadata":'
                  + b"[" * depth + b"]" * depth + b"}")
        r, took = timed(client, url, content=nested, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "levels deep" in r.json()["error"]["message"]
        assert took < 20 * ordinary + 0.5, (depth, took)

    # -- size cases against the same request a tenth of the size ---------------------------------------------
    cases = {
        "10 MB message": (chat([user("word " * 200_000)]), chat([user("word " * 2_000_000)])),
        "10,000 messages": (chat(tiny_messages(1_000)), chat(tiny_messages(9_998))),
        "500 tools": (chat([user("hi [[len:10]]")], tools=tools(50)), chat([user("hi [[len:10]]")], tools=tools(500))),
        "n = 128": (chat([user("hi [[len:10]]")], n=13), chat([user("hi [[len:10]]")], n=128)),
        "n = 128, streamed": (chat([user("hi [[len:10]]")], n=13, stream=True),
                              chat([user("hi [[len:10]]")], n=128, stream=True)),
        "5 MB tool result": (tool_result(500_000), tool_result(5_000_000)),
    }
    for name, (reference, big) in cases.items():
        _, small_took = timed(client, url, reference)
        r, took = timed(client, url, big)
        report[name] = {"status": r.status_code, "s": round(took, 3), "reference_s": round(small_took, 3)}
        assert took < 30 * small_took + 1.0, (name, took, small_took)
        if "n = 128" in name and r.status_code == 200 and "stream" not in name:
            assert len(r.json()["choices"]) == 128

    # still serving, and nothing unhandled was logged
    assert timed(client, url, chat([user("still there? [[len:5]]")]))[0].status_code == 200
    assert "unhandled error" not in proxy.log() and "Traceback" not in proxy.log(), proxy.log()
    print(json.dumps(report, indent=1))
