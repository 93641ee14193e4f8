"""Two replicas without Redis (each with its own in-process hot state) sharing PostgreSQL: a replica whose hot copy
is behind the stored state gets StaleState when it saves, plans the turn again on the newer state, and loses no
message."""

from __future__ import annotations

import time

import httpx

from tests.resilience.conftest import Chat, metric_value, stored_user_texts


def test_a_replica_behind_the_stored_state_replans(migrated_db_url, home, start_proxy):
    env = {"DATABASE_URL": migrated_db_url}
    a, b = (start_proxy(home / name, env) for name in ("a", "b"))
    chat = Chat(a.url, "stale")
    sent: list[str] = []
    # a b b a a b b a ...: every other visit to a replica finds its own hot copy two turns behind.
    order = [a, b, b, a, a, b, b, a, a, b, b, a]
    with httpx.Client() as client:
        for i, replica in enumerate(order):
            chat.base_url = replica.url
            text = chat.user_text(i, pad=200)
            r = chat.send(client, text)
            assert r.status_code == 200, (r.text, replica.log())
            sent.append(text)
    # a turn queued behind its answer meets the newer stored state when its write lands, after the answer: wait for
    # the writes (nothing lost) and for that replan to be counted
    deadline = time.monotonic() + 15
    while True:
        stored = stored_user_texts(migrated_db_url, chat.conversation_id, len(sent))
        replans = sum(metric_value(p.url, "memci_engine_errors_total", 'stage="stale_state"') for p in (a, b))
        if (stored == sent and replans > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stored == sent
    assert replans > 0
    assert all(metric_value(p.url, "memci_store_write_failures_total") == 0 for p in (a, b))
