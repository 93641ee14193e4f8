"""The managed turn in process: CPU of TurnService.handle (lookup, lock, plan, the upstream request encoded, the
answer read, the turn queued) on the multi-turn chat of overhead.py, against an upstream that answers at once and
the in-memory repository of the unit tests. No HTTP server, no PostgreSQL: what the turn itself costs.

    python loadtests/bench_turn.py                 # 3 chats of 60 turns; p50 per turn
    python loadtests/bench_turn.py --profile       # and the functions that take the time (cProfile)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit" / "turn")]

from loadtests.turn_overhead import chat_bodies  # noqa: E402
from proxy.metrics import Metrics  # noqa: E402
from proxy.store.factory import Store  # noqa: E402
from proxy.store.hot.memory import InProcessHotState  # noqa: E402
from proxy.turn.call import chat_call  # noqa: E402
from proxy.turn.service import TurnService  # noqa: E402
from proxy.upstream.exchange import Exchange  # noqa: E402
from proxy.wire.validate import parse_chat_body, validate_chat_request  # noqa: E402
from turn_fakes import MemoryRepository, settings  # noqa: E402

ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 3000, "completion_tokens": 5, "total_tokens": 3005}}).encode()


class _Body:
    async def iter_any(self):
        yield ANSWER


class _Answer:
    status = 200
    headers = {"Content-Type": "application/json"}
    content = _Body()

    async def read(self) -> bytes:
        return ANSWER

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


class InstantUpstream:
    """proxy.upstream.port.Upstream answering every request at once."""

    def url(self, path: str, query: str = "", route_key: str | None = None) -> str:
        return "http://upstream/v1" + path

    def forward_headers(self, headers):
        return dict(headers)

    async def send(self, method, url, headers, body):
        return _Answer(), 0.0

    async def read_body(self, response) -> bytes:
        return ANSWER


async def run(chats: int, turns: int) -> tuple[list[float], list[float]]:
    metrics = Metrics()
    store = Store(repo=MemoryRepository(), hot=InProcessHotState(), kind_db="memory", kind_hot="in-process",
                  database_url="")
    service = TurnService(settings(context_window=32768), metrics, Exchange(InstantUpstream(), metrics), store)
    service.start()
    parse, handle = [], []
    for chat in range(chats):
        for body in chat_bodies(f"chat {chat} {time.time_ns()}", turns):
            started = time.perf_counter()
            data, raw = parse_chat_body(body)
            validate_chat_request(data)
            call = chat_call({"Authorization": "Bearer bench"}, data, body, raw, started=started)
            parsed = time.perf_counter()
            await service.handle(call)
            await asyncio.sleep(0)  # the after-answer step
            await asyncio.sleep(0)
            parse.append(parsed - started)
            handle.append(time.perf_counter() - parsed)
    await service.close()
    return parse, handle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    asyncio.run(run(1, args.turns))  # warm-up
    parse, handle = asyncio.run(run(args.chats, args.turns))
    ms = lambda values, q: 1000 * statistics.quantiles(values, n=100)[q - 1]  # noqa: E731
    print(f"{args.chats} chats of {args.turns} turns: parse+validate p50 {ms(parse, 50):.3f} ms; "
          f"managed turn p50 {ms(handle, 50):.3f} ms, p99 {ms(handle, 99):.3f} ms")
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        asyncio.run(run(args.chats, args.turns))
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
