"""Planning time of the context engine against history length, hot state (the state of the previous turn).

For each history length the conversation is first planned once (cold), then `--turns` further turns are
planned one after the other, each adding an assistant answer (sometimes a tool call with its result) and a
user message, each with the state the previous turn returned. Message dicts are prebuilt (the HTTP body's
JSON parsing is not part of the figure). Reports p50/p99 per length, the growth between lengths, and the
size and (de)serialisation time of the state.

    .venv/bin/python loadtests/bench_engine.py [--turns 200] [--lengths 10,100,1000,10000]
"""

from __future__ import annotations

import argparse
import random
import statistics

import msgspec  # noqa: E402
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memci_proxy.engine import ConversationState, EngineConfig, EstimateCounter, TurnInput, plan  # noqa: E402

WORDS = ("index query table join cache page vacuum analyze plan buffer shared memory tune worker "
         "数据库 查询 优化 索引 缓存").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Conversation:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.messages: list[dict[str, Any]] = []
        self.calls = 0

    def user(self) -> None:
        self.messages.append({"role": "user", "content": words(self.rng, self.rng.randint(5, 60))})

    def answer(self) -> None:
        rng = self.rng
        if rng.random() < 0.3:
            self.calls += 1
            call_id = f"call_{self.calls}"
            self.messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "search", "arguments": '{"q": "%s"}' % words(rng, 3)}}]})
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": words(rng, rng.randint(20, 300))})
        self.messages.append({"role": "assistant", "content": words(rng, rng.randint(20, 150))})

    def grow_to(self, length: int) -> None:
        while len(self.messages) < length:
            self.user()
            if len(self.messages) < length:
                self.answer()
        del self.messages[length:]
        if self.messages[-1]["role"] != "user":
            self.user()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_length(length: int, turns: int, config: EngineConfig, raw: bool) -> dict[str, float]:
    counter = EstimateCounter()
    conv = Conversation(seed=length)
    conv.grow_to(length)
    system = [{"role": "system", "content": "You are a database tuning assistant. " * 20}]
    now = 1_700_000_000.0
    state = plan(None, TurnInput(system=system, messages=list(conv.messages), now=now), config, counter).state
    times: list[float] = []
    epochs = 0
    for _ in range(turns):
        conv.answer()
        conv.user()
        now += 20.0
        # the proxy has the body's bytes: the raw `messages` array is a slice of them (not timed)
        body_messages = msgspec.json.encode([*system, *conv.messages]) if raw else None
        turn = TurnInput(system=system, messages=list(conv.messages), now=now, intent="tune the index",
                         raw_messages=body_messages)
        start = time.perf_counter()
        result = plan(state, turn, config, counter)
        times.append((time.perf_counter() - start) * 1000.0)
        epochs += result.epoch
        state = result.state
    blob = state.to_bytes()
    start = time.perf_counter()
    for _ in range(20):
        ConversationState.from_bytes(blob)
    decode_ms = (time.perf_counter() - start) * 1000.0 / 20
    start = time.perf_counter()
    for _ in range(20):
        state.to_bytes()
    encode_ms = (time.perf_counter() - start) * 1000.0 / 20
    return {
        "length": length,
        "p50": statistics.median(times),
        "p99": percentile(times, 0.99),
        "max": max(times),
        "epochs": epochs,
        "state_kb": len(blob) / 1024,
        "encode_ms": encode_ms,
        "decode_ms": decode_ms,
        "active_msgs": len(result.messages),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--lengths", default="10,100,1000,10000")
    parser.add_argument("--context-window", type=int, default=32768)
    args = parser.parse_args()
    config = EngineConfig(context_window=args.context_window)
    for raw in (True, False):
        rows = [bench_length(int(n), args.turns, config, raw) for n in args.lengths.split(",")]
        print()
        print(f"context_window={args.context_window} turns={args.turns} (each turn adds ~2-4 messages); known prefix "
              + ("checked on the body's raw bytes (TurnInput.raw_messages)" if raw else "re-encoded by the engine"))
        report(rows)


def report(rows: list[dict[str, float]]) -> None:
    print(f"{'history':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'epochs':>6} {'upstream':>8} "
          f"{'state KiB':>9} {'encode ms':>9} {'decode ms':>9}")
    for r in rows:
        print(f"{r['length']:>8} {r['p50']:>8.3f} {r['p99']:>8.3f} {r['max']:>8.3f} {r['epochs']:>6} "
              f"{r['active_msgs']:>8} {r['state_kb']:>9.1f} {r['encode_ms']:>9.3f} {r['decode_ms']:>9.3f}")
    for a, b in zip(rows, rows[1:]):
        print(f"p50 growth {a['length']} -> {b['length']} messages: x{b['p50'] / a['p50']:.2f} "
              f"(history x{b['length'] / a['length']:.0f})")


if __name__ == "__main__":
    main()
