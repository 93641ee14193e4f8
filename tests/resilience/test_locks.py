"""The session lock with a real Redis: requests of one conversation run one at a time, a crashed holder's lease
expires, a held lease is renewed."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from memci_proxy.turn.identity import conversation_id_for_session, tenant_of
from memci_proxy.store.hot.redis import RedisHotState, lock_key
from memci_proxy.store.ports import LockTimeout
from tests.resilience.conftest import Chat, metric_value, stored_user_texts


async def _concurrently(base: str, bodies: list[dict], headers: dict) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60) as client:
        return await asyncio.gather(*(client.post(base + "/v1/chat/completions", json=b, headers=headers)
                                      for b in bodies))


def test_concurrent_requests_of_one_conversation_are_serialised(redis_proc, migrated_db_url, home, start_proxy):
    proxy = start_proxy(home, {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url})
    chat = Chat(proxy.url, "together")
    headers = {**chat.headers(), "X-Session-Id": "together-1"}
    with httpx.Client() as client:
        for i in range(3):
            text = chat.user_text(i)
            r = client.post(proxy.base_url + "/chat/completions", json=chat.body(text), headers=headers, timeout=30)
            assert r.status_code == 200
            chat.accept(text, r.json()["choices"][0]["message"]["content"])
    # Four identical requests at once (a client retrying), each taking 0.5 s upstream.
    body = chat.body(chat.user_text(3, "[[delay:0.5]]"))
    waited_before = metric_value(proxy.url, "memci_lock_wait_seconds_sum")
    responses = asyncio.run(_concurrently(proxy.url, [body] * 4, headers))
    assert [r.status_code for r in responses] == [200] * 4
    waited = metric_value(proxy.url, "memci_lock_wait_seconds_sum") - waited_before
    assert waited >= 0.9 * 0.5 * (1 + 2 + 3), waited  # one at a time: 0, 0.5, 1.0 and 1.5 s of waiting
    conversation = responses[0].headers["x-memci-conversation-id"]
    assert conversation == conversation_id_for_session(tenant_of(chat.headers()), "together-1")
    stored = stored_user_texts(migrated_db_url, conversation, 4)
    assert len(stored) == 4 and stored[-1] == body["messages"][-1]["content"]
    assert "StaleState" not in proxy.log() and "lock lost" not in proxy.log()


def test_a_crashed_holders_lock_expires(redis_proc, migrated_db_url, home, start_proxy):
    proxy = start_proxy(home, {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url})
    chat = Chat(proxy.url, "crashed")
    headers = {**chat.headers(), "X-Session-Id": "crashed-1"}
    conversation = conversation_id_for_session(tenant_of(chat.headers()), "crashed-1")
    with redis_proc.client() as r:
        # never released, never renewed; long enough to outlast the request's way to the lock on a busy machine
        r.set(lock_key(conversation), "a-replica-that-died", px=3000)
    started = time.monotonic()
    with httpx.Client() as client:
        r = client.post(proxy.base_url + "/chat/completions", json=chat.body(chat.user_text(0)), headers=headers,
                        timeout=30)
    assert r.status_code == 200
    assert time.monotonic() - started >= 1.0
    assert metric_value(proxy.url, "memci_lock_wait_seconds_sum") >= 1.0


async def test_a_held_lease_is_renewed_and_released(redis_proc):
    hot = RedisHotState(redis_proc.url)
    other = RedisHotState(redis_proc.url)
    try:
        async with hot.lock("long-stream", timeout_s=1.0, lease_s=0.3):
            await asyncio.sleep(1.2)  # four leases long: alive only because it is renewed
            assert await hot.client.pttl(lock_key("long-stream")) > 0
            with pytest.raises(LockTimeout):
                async with other.lock("long-stream", timeout_s=0.3, lease_s=0.3):
                    pass
        async with other.lock("long-stream", timeout_s=0.5, lease_s=0.3):
            pass  # released at once when the holder is done
    finally:
        await hot.close()
        await other.close()
