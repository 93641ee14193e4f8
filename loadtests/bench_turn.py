"""The managed turn in process: CPU of TurnService.handle (lookup, lock, plan, the upstream request encoded, the
answer read, the turn queued) on the multi-turn chat of overhead.py, against an upstream that answers at once and
the in-memory repository of the unit tests. No HTTP server, no PostgreSQL: what the turn itself costs.

    python loadtests/bench_turn.py                 # 3 chats of 60 turns; p50 per turn
    python loadtests/bench_turn.py --profile       # and the functions that take the time (cProfile)
    python loadtests/bench_turn.py --window 4096 --embeddings-local use-multilingual-v3   # pages archived, and
        # embedded in the background by the packaged model (compare with --embeddings-local off)
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

from loadtests.turn_overhead import chat_bodies, probe_chat_bodies  # noqa: E402
from memci_proxy.metrics import Metrics  # noqa: E402
from memci_proxy.store.factory import Store  # noqa: E402
from memci_proxy.store.hot.memory import InProcessHotState  # noqa: E402
from memci_proxy.turn.call import chat_call  # noqa: E402
from memci_proxy.turn.service import TurnService  # noqa: E402
from memci_proxy.upstream.exchange import Exchange  # noqa: E402
from memci_proxy.wire.validate import parse_chat_body, validate_chat_request  # noqa: E402
from turn_fakes import MemoryRepository, settings  # noqa: E402

ANSWER = json.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 3000, "completion_tokens": 5, "total_tokens": 3005}}).encode()


def _answer_to(body: bytes) -> bytes:
    """The canned answer, its usage counting the request's prompt as /tokenize does (one token per 4 characters of
    its messages): a fixed count would teach the proxy a wrong ratio of its estimates to the upstream's."""
    messages = json.loads(body).get("messages") or []
    prompt = sum(len(json.dumps(m.get("content"))) for m in messages) // 4 + 4 * len(messages)
    answer = json.loads(ANSWER)
    answer["usage"] = {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
    return json.dumps(answer).encode()


class _Body:
    async def iter_any(self):
        yield ANSWER


class _Answer:
    status = 200
    headers = {"Content-Type": "application/json"}
    content = _Body()

    def __init__(self, body: bytes = ANSWER) -> None:
        self.body = body

    async def read(self) -> bytes:
        return self.body

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


def _tokenized(body: bytes) -> bytes:
    """SGLang's /tokenize answer (a text or a list of texts): one token per 4 characters."""
    prompt = json.loads(body)["prompt"]
    count = [len(p) // 4 for p in prompt] if isinstance(prompt, list) else len(prompt) // 4
    return json.dumps({"count": count, "max_model_len": 32768}).encode()


class InstantUpstream:
    """memci_proxy.upstream.port.Upstream answering every request at once (/tokenize too, counted)."""

    def __init__(self) -> None:
        self.tokenize_requests = 0

    def url(self, path: str, query: str = "", route_key: str | None = None) -> str:
        return "http://upstream/v1" + path

    def forward_headers(self, headers):
        return dict(headers)

    async def send(self, method, url, headers, body):
        if url.endswith("/tokenize"):
            self.tokenize_requests += 1
            return _Answer(_tokenized(body)), 0.0
        return _Answer(_answer_to(body)), 0.0

    async def read_body(self, response) -> bytes:
        return await response.read()


class VectorRepository(MemoryRepository):
    """The in-memory repository with page vectors (memci_proxy.store.ports.PageVectorStore), for --embeddings-local."""

    def __init__(self) -> None:
        super().__init__()
        self.vectors: dict[tuple[str, str], str] = {}

    async def put_page_vectors(self, tenant, conversation_id, model, vectors) -> int:
        for number, digest, _vector in vectors:
            self.vectors[(conversation_id, number)] = digest
        return len(vectors)

    async def page_vector_digests(self, tenant, conversation_id, model) -> dict[str, str]:
        return {n: d for (c, n), d in self.vectors.items() if c == conversation_id}

    async def nearest_pages(self, *args, **kwargs) -> list[tuple[str, float]]:
        return []

    async def ensure_vector_index(self, dim: int) -> str:
        return ""


async def run(chats: int, turns: int, window: int = 32768, local: str = "off",
              exchange_chars: int = 0, workload: str = "team") -> tuple[list[float], list[float]]:
    metrics = Metrics()
    repo = VectorRepository() if local != "off" else MemoryRepository()
    store = Store(repo=repo, hot=InProcessHotState(), kind_db="memory", kind_hot="in-process",
                  database_url="")
    upstream = InstantUpstream()
    service = TurnService(settings(context_window=window, embeddings_local=local), metrics,
                          Exchange(upstream, metrics), store)
    service.start()
    parse, handle = [], []
    chat_requests = [probe_chat_bodies(f"chat {chat} {time.time_ns()}", turns) if workload == "chat" else
                     chat_bodies(f"chat {chat} {time.time_ns()}", turns, exchange_chars=exchange_chars)
                     for chat in range(chats)]
    cpu = time.process_time()
    for bodies in chat_requests:
        for body in bodies:
            started = time.perf_counter()
            data, raw = parse_chat_body(body)
            validate_chat_request(data)
            call = chat_call({"Authorization": "Bearer bench"}, data, body, raw.get("messages"), started=started)
            parsed = time.perf_counter()
            await service.handle(call)
            await asyncio.sleep(0)  # the after-answer step
            await asyncio.sleep(0)
            parse.append(parsed - started)
            handle.append(time.perf_counter() - parsed)
    await service.close()  # the turns' after-answer work and the writes behind them finished
    cpu = time.process_time() - cpu
    embedded = len(repo.vectors) if isinstance(repo, VectorRepository) else 0
    print(f"pages archived: {int(metrics.pages_archived._value.get())}, embedded in the background: {embedded}, "
          f"/tokenize requests per turn: {upstream.tokenize_requests / len(handle):.2f}, "
          f"CPU per turn {1000 * cpu / len(handle):.3f} ms (all of it: body parsed, turn, after the answer, writes)")
    return parse, handle


def _last_turns(values: list[float], turns: int, last: int) -> list[float]:
    """The last ``last`` turns of each chat (``values`` holds the chats one after another)."""
    return [v for i, v in enumerate(values) if i % turns >= turns - last]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=3)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="cumulative", help="the profile's order: cumulative or tottime")
    parser.add_argument("--window", type=int, default=32768)
    parser.add_argument("--embeddings-local", default="off", help="the packaged model's name, or off")
    parser.add_argument("--exchange-chars", type=int, default=0,
                        help="pad each exchange to about this many characters (1500 over 600 turns: 0.9 MB bodies)")
    parser.add_argument("--last", type=int, default=0, help="report the last N turns of each chat only (long chats)")
    parser.add_argument("--workload", choices=("team", "chat"), default="team",
                        help="team: overhead.py's team chat; chat: the cache benchmark's chat (facts asked back: pushes)")
    args = parser.parse_args()
    if args.embeddings_local != "off":
        from memci_proxy.recall.vectors.packaged_models import packaged_model, shared_encoder

        shared_encoder(packaged_model(args.embeddings_local))  # loaded before the timed runs (as a proxy, at start)
    asyncio.run(run(1, min(args.turns, 60), args.window, args.embeddings_local, workload=args.workload))  # warm-up
    parse, handle = asyncio.run(run(args.chats, args.turns, args.window, args.embeddings_local, args.exchange_chars,
                                    args.workload))
    slowest = sorted(range(len(handle)), key=handle.__getitem__)[-8:]
    print("slowest turns: " + ", ".join(f"#{i % args.turns} {1000 * handle[i]:.1f} ms" for i in slowest))
    if args.last:
        parse, handle = (_last_turns(values, args.turns, args.last) for values in (parse, handle))
    ms = lambda values, q: 1000 * statistics.quantiles(values, n=100)[q - 1]  # noqa: E731
    print(f"{args.chats} chats of {args.turns} turns: parse+validate p50 {ms(parse, 50):.3f} ms; "
          f"managed turn p50 {ms(handle, 50):.3f} ms, p99 {ms(handle, 99):.3f} ms")
    if args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        asyncio.run(run(args.chats, args.turns, args.window, args.embeddings_local, args.exchange_chars, args.workload))
        profile.disable()
        pstats.Stats(profile).sort_stats(args.sort).print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
