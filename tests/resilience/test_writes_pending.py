"""The durability contract under failure (docs/architecture.md).

- The proxy SIGKILLed with answered turns still queued for PostgreSQL: restarted on the same home, it rebuilds the
  conversation from the last stored snapshot and the client's resent history; every message reaches the
  conversation API, every archived page reads back through the recall tool, the next prompt fits the window. With
  in-process hot state and with Redis (whose hot copy is then ahead of the database).
- Two replicas without Redis answering the same turn at once: one of their snapshots is stored, the other gets
  StaleState and goes on top of it; nothing is overwritten and no message is lost.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.resilience.conftest import MAX_TOKENS, WINDOW, Chat, metric_value, stored_user_texts

PENDING = {"MEMCI_WRITE_BEHIND_MAX_LAG_MS": "600000"}  # per-turn appends wait (until shutdown, which SIGKILL skips)


@pytest.mark.parametrize("hot", ["in-process", "redis"])
def test_sigkill_with_writes_pending_loses_nothing(hot, request, migrated_db_url, emulator_8k, home, start_proxy):
    env = {"DATABASE_URL": migrated_db_url}
    if hot == "redis":
        env["REDIS_URL"] = request.getfixturevalue("redis_proc").url
    proxy = start_proxy(home, {**env, **PENDING})
    port = proxy.port
    chat = Chat(proxy.url, f"pending-{hot}")
    sent: list[str] = []
    with httpx.Client() as client:
        i = 0
        while True:  # past the first epoch, then a few turns that are only queued
            text = chat.user_text(i, pad=300)
            r = chat.send(client, text)
            assert r.status_code == 200, (r.text, proxy.log())
            sent.append(text)
            i += 1
            if int(r.headers["x-memci-pages-archived"]) > 0:
                break
            assert i < 60
        for _ in range(3):
            text = chat.user_text(i, pad=300)
            assert chat.send(client, text).status_code == 200
            sent.append(text)
            i += 1
        conversation = chat.conversation_id
        assert len(stored_user_texts(migrated_db_url, conversation)) < len(sent)  # writes pending
        proxy.kill()

        proxy = start_proxy(home, env, port=port)
        text = chat.user_text(i, pad=300)
        r = chat.send(client, text)
        assert r.status_code == 200, (r.text, proxy.log())
        assert r.headers["x-memci-conversation-id"] == conversation
        sent.append(text)
        assert r.json()["usage"]["prompt_tokens"] + MAX_TOKENS <= WINDOW  # the next prompt fits

        history = client.get(f"{proxy.url}/memci/conversations/{conversation}", params={"limit": 1000},
                             headers=chat.headers(), timeout=30)
        assert history.status_code == 200, history.text
        users = [m["message"]["content"] for m in history.json()["messages"] if m["message"]["role"] == "user"]
        assert users == sent
        archived = [p["number"] for p in history.json()["pages"] if p["state"] != "active"]
        assert archived
        for label in archived:
            r = chat.send(client, f'Read page {label}. [[call:recall {{"pages": ["{label}"]}}]]')
            assert r.status_code == 200, r.text
            answer = r.json()["choices"][0]["message"]["content"]
            assert answer.startswith("Tool result:") and "zq" in answer, (label, answer[:300])
            assert "not found" not in answer.lower()
            assert re.search(r"Turn \d+ of pending", answer)


def test_two_replicas_without_redis_answering_the_same_turn(migrated_db_url, home, start_proxy):
    env = {"DATABASE_URL": migrated_db_url}
    a, b = (start_proxy(home / name, env) for name in ("a", "b"))
    chat = Chat(a.url, "together")
    sent: list[str] = []
    with httpx.Client() as client:
        for i in range(3):
            text = chat.user_text(i, pad=100)
            assert chat.send(client, text).status_code == 200
            sent.append(text)
        for i in range(3, 7):  # the same request to both replicas at once (a client retrying on another)
            text = chat.user_text(i, pad=100)
            body = chat.body(text)

            def post(replica):
                return httpx.post(replica.url + "/v1/chat/completions", json=body, headers=chat.headers(), timeout=60)

            with ThreadPoolExecutor(2) as pool:
                answers = list(pool.map(post, (a, b)))
            assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
            assert {r.headers["x-memci-conversation-id"] for r in answers} == {chat.conversation_id}
            chat.accept(text, answers[0].json()["choices"][0]["message"]["content"])
            sent.append(text)
    assert stored_user_texts(migrated_db_url, chat.conversation_id, len(sent)) == sent
    stale = sum(metric_value(p.url, "memci_engine_errors_total", 'stage="stale_state"') for p in (a, b))
    assert stale >= 1  # a conflict was detected, not overwritten
    assert all(metric_value(p.url, "memci_store_write_failures_total") == 0 for p in (a, b))
