"""Latency of the recall search as the proxy runs it (RecallResolver.search), against another tree's code.

A conversation of ``--pages`` archived pages, each a user message (15-60 words) and an answer (120-400 words) of the
packaged model's own vocabulary, dated over the ``--days`` days up to today; queries of 2-8 words of a page, half
of them naming a time ("last week", "two weeks ago", "yesterday", ...). Timed, k=5 (a recall call's hits):

* ``lexical``: the search without vectors;
* ``cold``: fused with the packaged model, embeddings_pages=candidates, no page vector kept (every candidate
  embedded by the search: the bound of one search's CPU);
* ``warm``: the same with the vectors of earlier searches kept.

``--baseline-tree DIR`` runs the same measurement over the proxy package of DIR (an export of the code before a
change) in a child process, rounds alternating, and prints each figure's ratio to it (same run, same machine).

Usage::

    python loadtests/bench_search.py --resolver --pages 1000 --queries 60 --baseline-tree /tmp/base-main
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

if os.environ.get("MEMCI_BENCH_TREE"):  # the child of --baseline-tree: that tree's proxy package
    sys.path.insert(0, os.environ["MEMCI_BENCH_TREE"])
elif __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

__all__ = ["TIMES", "conversation", "measure", "main"]

TIMES = ("last week", "two weeks ago", "yesterday", "in the past month", "last Saturday", "3 days ago")
NOW = dt.datetime(2026, 11, 20, 12, tzinfo=dt.timezone.utc).timestamp()


def conversation(pages: int, days: int, words: list[str], rng: random.Random) -> tuple[list[dict], list[float]]:
    """Messages (user, assistant per page) and each page's archive time, oldest first."""
    weights = [1.0 / rank**1.07 for rank in range(1, len(words) + 1)]
    messages, stamps = [], []
    for n in range(pages):
        user = " ".join(rng.choices(words, weights, k=rng.randint(15, 60)))
        answer = " ".join(rng.choices(words, weights, k=rng.randint(120, 400)))
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        stamps.append(NOW - (days - days * n / pages) * 86400)
    return messages, stamps


def queries(messages: list[dict], count: int, rng: random.Random) -> list[str]:
    out = []
    for n in range(count):
        words = rng.choice(messages[::2])["content"].split()
        query = " ".join(rng.sample(words, min(len(words), rng.randint(2, 8))))
        out.append(f"{query} {rng.choice(TIMES)}" if n % 2 else query)
    return out


def measure(pages: int, days: int, count: int, seed: int, model: str) -> dict[str, dict[str, float]]:
    """p50 / p90 wall and p50 CPU milliseconds of each search kind (module docstring)."""
    from loadtests.bench_search import english_vocabulary
    from memci_proxy.engine import EstimateCounter
    from memci_proxy.engine.state import ARCHIVED, ConversationState, PageRecord
    from memci_proxy.recall.vectors.candidates import CandidateVectors
    from memci_proxy.recall.vectors.local_embedder import LocalEmbedder
    from memci_proxy.recall.resolver import RecallContext, RecallResolver

    rng = random.Random(seed)
    messages, stamps = conversation(pages, days, english_vocabulary(20_000), rng)
    asked = queries(messages, count, rng)
    records = [PageRecord(number=n + 1, part=1, start=2 * n, end=2 * n + 2, tokens=400, status=ARCHIVED,
                          first_seen=stamp) for n, stamp in enumerate(stamps)]
    ctx = RecallContext("t", "c", ConversationState(pages=records), messages)
    embedder = LocalEmbedder(model)
    embedder._model()
    vectors = CandidateVectors(embedder, cache_max_bytes=512 * 2**20)
    resolvers = {"lexical": RecallResolver(None, EstimateCounter(), 2048, clock=lambda: NOW),
                 "fused": RecallResolver(None, EstimateCounter(), 2048, vectors=vectors, clock=lambda: NOW)}

    async def timed(resolver: RecallResolver, chosen: list[str], cold: bool) -> dict[str, float]:
        wall, cpu = [], []
        for query in chosen:
            embedder._query_vectors.clear()
            if cold:
                vectors._by_digest.clear()
            began, used = time.perf_counter(), time.process_time()
            await resolver.search(ctx, query, 5)
            wall.append((time.perf_counter() - began) * 1000.0)
            cpu.append((time.process_time() - used) * 1000.0)
        ordered = sorted(wall)
        return {"p50": statistics.median(wall), "p90": ordered[int(0.9 * (len(ordered) - 1))],
                "cpu_p50": statistics.median(cpu)}

    async def run() -> dict[str, dict[str, float]]:
        for resolver in resolvers.values():
            await resolver.search(ctx, asked[0], 5)  # builds the index
        out = {}
        for name, resolver, cold in (("lexical", resolvers["lexical"], False), ("cold", resolvers["fused"], True),
                                     ("warm", resolvers["fused"], False)):
            for dated in (False, True):
                out[f"{name}, {'dated' if dated else 'undated'}"] = await timed(resolver, asked[int(dated)::2], cold)
        await vectors.close()
        return out

    return asyncio.run(run())


def _child(tree: str, argv: list[str]) -> dict[str, dict[str, float]]:
    env = dict(os.environ, MEMCI_BENCH_TREE=tree, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, __file__, *argv, "--json"], env=env, check=True, capture_output=True,
                          text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    import argparse

    from memci_proxy.recall.vectors.packaged_models import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each tree, alternating")
    parser.add_argument("--baseline-tree", default="", help="a tree of the code before (its proxy package)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.json:
        print(json.dumps(measure(args.pages, args.days, args.queries, args.seed, args.model)))
        return 0
    child_args = ["--pages", str(args.pages), "--days", str(args.days), "--queries", str(args.queries),
                  "--seed", str(args.seed), "--model", args.model]
    here = str(Path(__file__).resolve().parents[1])
    trees = {"this tree": here, **({"baseline": args.baseline_tree} if args.baseline_tree else {})}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in trees}
    for _ in range(max(1, args.rounds)):
        for name, tree in reversed(list(trees.items())):
            runs[name].append(_child(tree, child_args))
    print(f"RecallResolver.search, k=5: {args.pages} pages (user message + answer) over {args.days} days, "
          f"{args.queries} queries (half naming a time), {args.model}, {args.rounds} round(s) per tree, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    figures: dict[str, dict[str, dict[str, float]]] = {}
    for name, results in runs.items():
        figures[name] = {kind: {key: statistics.median(r[kind][key] for r in results) for key in results[0][kind]}
                         for kind in results[0]}
    for kind in figures["this tree"]:
        cells = []
        for key in ("p50", "p90", "cpu_p50"):
            value = figures["this tree"][kind][key]
            cell = f"{key} {value:.2f} ms"
            if "baseline" in figures:
                base = figures["baseline"][kind][key]
                cell += f" (baseline {base:.2f}, x{value / base:.2f})" if base else ""
            cells.append(cell)
        print(f"{kind:<18} " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
