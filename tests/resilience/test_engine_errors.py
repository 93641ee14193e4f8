"""Corrupt stored state as a stand-in for any engine failure: an unreadable hot copy is passed over (the process's own
copy, else the database's serves); an unreadable stored state sends the client's request upstream unchanged, and
memci_engine_errors_total counts it."""

from __future__ import annotations

import httpx
import psycopg

from memci_proxy.store.hot.redis import state_key
from memci_proxy.store.sql.urls import to_libpq_url
from tests.resilience.conftest import Chat, last_chat_prompt, metric_value


def test_unreadable_state_is_survived(redis_proc, migrated_db_url, emulator_8k, home, start_proxy):
    env = {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url}
    proxy = start_proxy(home, env)
    chat = Chat(proxy.url, "corrupt")
    with httpx.Client() as client:
        for i in range(3):
            assert chat.send(client, chat.user_text(i)).status_code == 200
        conversation = chat.conversation_id
        with redis_proc.client() as r:
            r.hset(state_key(conversation), mapping={"v": 99, "s": b"not a snapshot"})
        r = chat.send(client, chat.user_text(3))
        assert r.status_code == 200
        assert r.headers["x-memci-conversation-id"] == conversation  # still managed, from the process's own copy
        assert metric_value(proxy.url, "memci_engine_errors_total", 'stage="hot_snapshot"') == 1

        port = proxy.port
        proxy.stop()  # a new process knows only what is stored
        with redis_proc.client() as r:
            r.delete(state_key(conversation))
        with psycopg.connect(to_libpq_url(migrated_db_url), autocommit=True) as conn:
            conn.execute("UPDATE conversations SET state = %s WHERE id = %s", (b"junk", conversation))
        proxy = start_proxy(home, env, port=port)
        text = chat.user_text(4)
        body = chat.body(text)
        r = chat.send(client, text)
        assert r.status_code == 200
        assert "x-memci-conversation-id" not in r.headers  # sent unchanged
        assert metric_value(proxy.url, "memci_engine_errors_total", 'stage="plan"') == 1
        assert last_chat_prompt(emulator_8k, chat) == body["messages"]
