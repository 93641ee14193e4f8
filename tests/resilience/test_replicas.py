"""Two replicas sharing one Redis and one PostgreSQL, each conversation's turns alternating between them: the same
upstream prompts as one replica sends, no lock time-outs (a reduced loadtests/replicas.py). The costs learned from
the upstream's counts are per process (a replica that has seen more answers may place an epoch a few tokens apart),
so the prompts are compared with learning off; with it on, every turn is answered within the budget."""

from __future__ import annotations

import asyncio

from loadtests.replicas import compare, replica_report, run
from tests.resilience.conftest import env_int


def test_alternating_replicas_send_the_prompts_of_one(redis_proc, migrated_db_url, emulator_8k, home, start_proxy):
    env = {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url, "MEMCI_COUNT_LEARNING": "false"}
    replicas = [start_proxy(home / f"r{i}", env) for i in range(2)]
    urls = [p.url for p in replicas]
    conversations = env_int("MEMCI_REPLICA_CONVERSATIONS", 6)
    turns = 14  # past the first compaction epoch
    one = asyncio.run(run(urls[:1], emulator_8k.url, "sk-one", conversations, turns, pad=300))
    two = asyncio.run(run(urls, emulator_8k.url, "sk-two", conversations, turns, pad=300))
    assert one.statuses == {200: conversations * turns}
    assert two.statuses == {200: conversations * turns}
    assert len(one.prompts) == conversations * turns
    assert any("Contents of archived pages" in str(p["messages"][0]) for p in two.prompts.values())
    assert compare(one, two) == []
    report = replica_report(urls)
    assert report["lock_timeouts"] == 0
    assert report["lock_wait_p99_s"] is not None
    for p in replicas:
        assert "StaleState" not in p.log()
        assert "another state was stored" not in p.log()  # no turn planned or stored twice
