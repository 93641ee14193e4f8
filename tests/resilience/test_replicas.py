"""Two replicas sharing one Redis and one PostgreSQL, each conversation's turns alternating between them: the same
upstream prompts as one replica sends, no lock time-outs (a reduced loadtests/replicas.py). The token costs learned
from the upstream's counts belong to the conversation's state, so they are on here as by default."""

from __future__ import annotations

import asyncio

import pytest

from loadtests.replicas import compare, replica_report, run
from tests.resilience.conftest import env_int


def test_alternating_replicas_send_the_prompts_of_one(redis_proc, migrated_db_url, emulator_8k, home, start_proxy):
    env = {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url}
    replicas = [start_proxy(home / f"r{i}", env) for i in range(2)]
    urls = [p.url for p in replicas]
    conversations = env_int("MEMCI_REPLICA_CONVERSATIONS", 6)
    turns = 14  # past the first compaction epoch
    one = asyncio.run(run(urls[:1], emulator_8k.url, "sk-one", conversations, turns, pad=300))
    two = asyncio.run(run(urls, emulator_8k.url, "sk-two", conversations, turns, pad=300))
    assert one.statuses == {200: conversations * turns}
    assert two.statuses == {200: conversations * turns}
    assert len(one.prompts) == conversations * turns
    assert any("Contents of archived pages" in str(p["messages"]) for p in two.prompts.values())
    assert compare(one, two) == []
    report = replica_report(urls)
    assert report["lock_timeouts"] == 0
    assert report["lock_wait_p99_s"] is not None
    for p in replicas:
        assert "StaleState" not in p.log()
        assert "another state was stored" not in p.log()  # no turn planned or stored twice


@pytest.mark.parametrize("workers", ["off", "on"])
def test_one_long_chat_alternating_between_replicas_is_planned_as_by_one(redis_proc, migrated_db_url, emulator_8k,
                                                                          home, start_proxy, workers):
    """One 100-turn chat, every turn on the other replica, against one proxy replaying it: the plan reads only the
    conversation's shared state (its learned token costs included), never what one process alone saw. Messages of
    about 1,400 characters: planned with the estimate and the learned costs, no /tokenize wait that a busy machine
    could time out. With the memory workers on (the default), each epoch shows the summary and profile covering
    the pages archived before it, whichever replica ran the jobs and however late they finished."""
    env = {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url,
           "MEMCI_MEMORY_WORKERS": "true" if workers == "on" else "false"}
    urls = [start_proxy(home / f"r{i}", env).url for i in range(2)]
    turns = 100
    one = asyncio.run(run(urls[:1], emulator_8k.url, "sk-one", 1, turns, pad=200))
    two = asyncio.run(run(urls, emulator_8k.url, "sk-two", 1, turns, pad=200))
    assert one.statuses == two.statuses == {200: turns}
    assert len(one.prompts) == len(two.prompts) == turns
    assert sum("Contents of archived pages" in str(p["messages"]) for p in two.prompts.values()) > turns // 2
    if workers == "on":
        assert sum("## Conversation summary" in str(p["messages"]) for p in two.prompts.values()) > turns // 3
    identical = turns - len(compare(one, two))
    assert identical >= 95, compare(one, two)[:5]
    assert abs(one.hit_rate - two.hit_rate) <= 0.01, (one.hit_rate, two.hit_rate)
