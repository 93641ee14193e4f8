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
