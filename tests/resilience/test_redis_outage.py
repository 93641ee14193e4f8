"""Redis killed mid-conversation and brought back: the proxy keeps answering (in-process hot state and locks),
says so in a metric and a log line, goes back to Redis when it returns; PostgreSQL keeps every message."""

from __future__ import annotations

import time

import httpx

from tests.resilience.conftest import Chat, metric_value, stored_user_texts


def test_redis_killed_and_restarted_mid_conversation(redis_proc, migrated_db_url, home, start_proxy):
    proxy = start_proxy(home, {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url})
    chat = Chat(proxy.url, "redisout")
    sent: list[str] = []
    with httpx.Client() as client:
        def turn(i: int) -> None:
            text = chat.user_text(i, pad=150)
            r = chat.send(client, text)
            assert r.status_code == 200, (r.text, proxy.log())
            sent.append(text)

        for i in range(6):
            turn(i)
        assert metric_value(proxy.url, "memci_hot_state_degraded") == 0
        redis_proc.kill()
        for i in range(6, 12):
            turn(i)
        assert metric_value(proxy.url, "memci_hot_state_degraded") == 1
        assert "Redis unreachable" in proxy.log()
        redis_proc.start()
        time.sleep(5.5)  # the retry interval of ResilientHotState
        for i in range(12, 16):
            turn(i)
        assert metric_value(proxy.url, "memci_hot_state_degraded") == 0
        assert "Redis reachable again" in proxy.log()
        with redis_proc.client() as r:
            assert r.exists(f"memci:{{{chat.conversation_id}}}:state")
    assert stored_user_texts(migrated_db_url, chat.conversation_id, len(sent)) == sent
    assert "StaleState" not in proxy.log()


def test_redis_down_at_start(migrated_db_url, home, start_proxy):
    from tests.e2e.proxyproc import free_port

    proxy = start_proxy(home, {"DATABASE_URL": migrated_db_url, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    chat = Chat(proxy.url, "noredis")
    with httpx.Client() as client:
        for i in range(3):
            assert chat.send(client, chat.user_text(i)).status_code == 200
    assert "unreachable" in proxy.log()
    assert metric_value(proxy.url, "memci_hot_state_degraded") == 1
    assert len(stored_user_texts(migrated_db_url, chat.conversation_id, 3)) == 3
