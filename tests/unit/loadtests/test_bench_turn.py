"""loadtests/bench_turn.py keeps running against the turn service it measures: a short chat through it plans every
turn (no fallback to forwarding unchanged) and reads every answer."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_turn", ROOT / "loadtests" / "bench_turn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_chat_runs_through_the_managed_turn(caplog):
    bench = load_bench()
    with caplog.at_level(logging.WARNING):
        parse, handle = asyncio.run(bench.run(1, 6, exchange_chars=600))
    assert len(parse) == len(handle) == 6
    failures = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not failures, failures
    assert bench._last_turns([1, 2, 3, 4, 5, 6], 3, 1) == [3, 6]


def test_active_pages_are_read_ahead_only_near_an_epoch():
    """Behind the answers, a conversation far below its budget reads nothing ahead; one near its next epoch has its
    complete active pages' terms read, and the epoch archives them without reading them again."""
    import time

    from memci_proxy.metrics import Metrics
    from memci_proxy.store.factory import Store
    from memci_proxy.store.hot.memory import InProcessHotState
    from memci_proxy.turn.call import chat_call
    from memci_proxy.turn.service import TurnService
    from memci_proxy.upstream.exchange import Exchange
    from memci_proxy.wire.validate import parse_chat_body
    from turn_fakes import MemoryRepository, settings

    bench = load_bench()

    async def prepared_after(window: int, turns: int) -> int:
        metrics = Metrics()
        store = Store(repo=MemoryRepository(), hot=InProcessHotState(), kind_db="memory", kind_hot="in-process",
                      database_url="")
        service = TurnService(settings(context_window=window, embeddings_local="off"), metrics,
                              Exchange(bench.InstantUpstream(), metrics), store)
        service.start()
        for body in bench.chat_bodies(f"c{time.time_ns()}", turns, exchange_chars=600):
            data, raw = parse_chat_body(body)
            await service.handle(chat_call({"Authorization": "Bearer t"}, data, body, raw.get("messages")))
            for _ in range(3):
                await asyncio.sleep(0)
        await service.close()
        lru = service.resolver.indexes._indexes
        entries = [lru.peek(key) for key in lru]
        return sum(len(entry.prepared) + len(entry.starts) for entry in entries)

    assert asyncio.run(prepared_after(1_048_576, 8)) == 0  # far from any epoch
    assert asyncio.run(prepared_after(4096, 12)) > 0  # near one (or past one: indexed)
