"""The managed turn's added time by what the turn did: the chat of ``overhead.py --multi-turn --workload chat`` sent
turn by turn to the three targets in turn (the emulator direct, the proxy in pass-through, the managed proxy), so
each managed turn is set against the same client body answered direct and through pass-through at the same moment.

    python loadtests/turn_kinds.py --turns 150 --window 8192 --rounds 2

Each managed turn is sorted by what it did, read from the answer's ``X-Memci-Epoch`` header and from the proxy's
``/metrics`` after it (read between turns, outside the timed requests): ``plain``, ``push`` (a proactive recall
round went with the request), ``epoch`` and ``epoch+push``, ``recall`` (the model called ``recall``: a second
round at least; ``push+recall`` with a push). Reported per kind: how many turns, the median and largest added time
over the direct answer of the same body; and for the whole chat the added p50 and p99 of the managed proxy and of
pass-through, the figures the issue's 150-turn targets name (managed p50 <= pass-through + 2 ms, p99 <= + 10 ms).
Then where each kind's time went: the median of each step of the managed turn (``memci_turn_stage_seconds``, read
from the same scrapes: memci_proxy.turn.stages), the direct answer's own time beside it, for the kind's turns and for
its slowest tenth (``--stages no`` leaves the table out).

The upstream's own time for a managed turn is that of its own prompt, which is bounded and differs from the client's
body: a turn with a second round (``recall``) counts the whole second round as added time, as a client sees it.
The order of the three targets rotates from turn to turn, so no target always finds the machine just after another.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.overhead import Server, free_port, percentile  # noqa: E402
from loadtests.turn_overhead import _start, probe_chat_bodies  # noqa: E402
from memci_proxy.turn.stages import STAGES  # noqa: E402

DIRECT, PASS, MANAGED = "direct", "pass-through", "managed"
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer turn-kinds-bench"}
_SAMPLE = re.compile(r'^(memci_recall_pushes_total\{outcome="pushed"\}|memci_recall_rounds_sum)\s+([0-9.e+-]+)$',
                     re.MULTILINE)
_STAGE = re.compile(r'^memci_turn_stage_seconds_sum\{stage="([a-z]+)"\}\s+([0-9.e+-]+)$', re.MULTILINE)


def counters(text: str) -> tuple[float, float]:
    """(turns pushed, recall rounds of the model's) so far, from the proxy's /metrics text."""
    found = {name: float(value) for name, value in _SAMPLE.findall(text)}
    return found.get('memci_recall_pushes_total{outcome="pushed"}', 0.0), found.get("memci_recall_rounds_sum", 0.0)


def stage_sums(text: str) -> dict[str, float]:
    """Seconds spent so far in each step of the managed turn (memci_turn_stage_seconds), from /metrics."""
    return {stage: float(value) for stage, value in _STAGE.findall(text)}


def kind_of(epoch: bool, pushed: bool, recalled: bool) -> str:
    if recalled:
        return "push+recall" if pushed else "recall"
    if epoch:
        return "epoch+push" if pushed else "epoch"
    return "push" if pushed else "plain"


async def timed_post(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, dict[str, str]]:
    start = time.perf_counter()
    async with session.post(url, data=body, headers=HEADERS) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status}")
        return time.perf_counter() - start, {name.lower(): value for name, value in resp.headers.items()}


Row = tuple[str, dict[str, float]]  # (kind, seconds by target, and by stage of the managed turn: "stage:plan")


async def run_chat(bases: dict[str, str], metrics_url: str, turns: int, round_no: int) -> list[Row]:
    """One chat, each turn sent to the three targets in turn: (kind, seconds by target and by stage) per turn."""
    bodies = probe_chat_bodies(f"turn kinds round {round_no} {time.time_ns()}", turns)
    rows: list[Row] = []
    order = [DIRECT, PASS, MANAGED]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def scrape() -> tuple[tuple[float, float], dict[str, float]]:
            async with session.get(metrics_url) as resp:
                text = await resp.text()
                return counters(text), stage_sums(text)

        before, stages_before = await scrape()
        for number, body in enumerate(bodies):
            seconds: dict[str, float] = {}
            epoch = False
            for target in order[number % 3:] + order[:number % 3]:
                seconds[target], headers = await timed_post(session, bases[target] + "/chat/completions", body)
                if target == MANAGED:
                    epoch = headers.get("x-memci-epoch") == "true"
            after, stages_after = await scrape()
            for stage, total in stages_after.items():
                seconds[f"stage:{stage}"] = total - stages_before.get(stage, 0.0)
            rows.append((kind_of(epoch, after[0] > before[0], after[1] > before[1]), seconds))
            before, stages_before = after, stages_after
    return rows


KINDS = ("plain", "push", "epoch", "epoch+push", "recall", "push+recall")


def stage_report(rows: list[Row]) -> str:
    """Per kind, the median of each step of the managed turn and of the direct answer's time, over the kind's turns
    and over its slowest tenth by added time (at least one turn): what a slow turn of the kind spent its time on."""
    ms = lambda v: f"{v * 1000:.2f}"  # noqa: E731
    lines = ["| turn | of them | added | " + " | ".join(STAGES) + " | direct |",
             "| --- | --- | ---: | " + " | ".join("---:" for _ in STAGES) + " | ---: |"]
    for kind in KINDS:
        chosen = sorted((s for k, s in rows if k == kind), key=lambda s: s[MANAGED] - s[DIRECT])
        if not chosen or not any(key.startswith("stage:") for key in chosen[0]):
            continue
        for label, part in (("all", chosen), ("slowest tenth", chosen[-max(1, len(chosen) // 10):])):
            cells = [ms(statistics.median(s.get(f"stage:{stage}", 0.0) for s in part)) for stage in STAGES]
            added = ms(statistics.median(s[MANAGED] - s[DIRECT] for s in part))
            direct = ms(statistics.median(s[DIRECT] for s in part))
            lines.append(f"| {kind} | {label} ({len(part)}) | {added} | " + " | ".join(cells) + f" | {direct} |")
    return "\n".join(lines)


def report(rows: list[Row], rounds: int, turns: int, source: str = "", stages: bool = True) -> str:
    ms = lambda v: f"{v * 1000:+.2f}"  # noqa: E731
    lines = [f"## The managed turn by what it did: {turns}-turn chat, {rounds} round(s), {len(rows)} turns{source}\n",
             "| turn | turns | managed added, median | largest |", "| --- | ---: | ---: | ---: |"]
    kinds: dict[str, list[float]] = {}
    for kind, seconds in rows:
        kinds.setdefault(kind, []).append(seconds[MANAGED] - seconds[DIRECT])
    for kind in KINDS:
        if kind in kinds:
            added = kinds[kind]
            lines.append(f"| {kind} | {len(added)} | {ms(statistics.median(added))} ms | {ms(max(added))} ms |")
    lines += ["", "| target | added p50 | added p99 |", "| --- | ---: | ---: |"]
    for target in (PASS, MANAGED):
        added = sorted(seconds[target] - seconds[DIRECT] for _, seconds in rows)
        lines.append(f"| {target} | {ms(percentile(added, 0.5) or 0)} ms | {ms(percentile(added, 0.99) or 0)} ms |")
    managed = sorted(s[MANAGED] - s[DIRECT] for _, s in rows)
    passing = sorted(s[PASS] - s[DIRECT] for _, s in rows)
    p50 = (percentile(managed, 0.5) or 0) - (percentile(passing, 0.5) or 0)
    p99 = (percentile(managed, 0.99) or 0) - (percentile(passing, 0.99) or 0)
    lines += ["", f"managed over pass-through: p50 {ms(p50)} ms (target +2), p99 {ms(p99)} ms (target +10)"]
    table = stage_report(rows) if stages else ""
    if table.count("\n") > 1:
        lines += ["", "Where the managed turn's time went, ms (medians; memci_turn_stage_seconds):", "", table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--window", type=int, default=8192, help="the managed proxy's context window")
    parser.add_argument("--rounds", type=int, default=2, help="chats, one after the other, each on its own text")
    parser.add_argument("--proxy-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment of both proxies")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--stages", choices=("yes", "no"), default="yes",
                        help="the table of each kind's time by step of the managed turn (a tree without "
                             "memci_turn_stage_seconds has none)")
    parser.add_argument("--tree", type=Path, default=None,
                        help="run the managed proxy from another checkout's source (the code before a change: run the "
                             "command once with it and once without, one after the other)")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="memci-turn-kinds-"))
    port = free_port()
    upstream = f"http://127.0.0.1:{port}/v1"
    emulator = Server("emulator", [args.python, "-m", "memci_proxy.cli", "emulate", "--port", str(port),
                                   "--max-model-len", str(1 << 20)], f"http://127.0.0.1:{port}/health",
                      log_dir=workdir)
    servers: list[Server] = []
    try:
        emulator.start(timeout=60)
        env = dict(kv.split("=", 1) for kv in args.proxy_env)
        bases = {DIRECT: upstream}
        server, bases[PASS] = _start(args.python, upstream, workdir, False, env)
        servers.append(server)
        server, bases[MANAGED] = _start(args.python, upstream, workdir, True,
                                        {**env, "MEMCI_CONTEXT_WINDOW": str(args.window)},
                                        args.tree.resolve() if args.tree else None)
        servers.append(server)
        metrics_url = bases[MANAGED].removesuffix("/v1") + "/metrics"
        asyncio.run(run_chat(bases, metrics_url, 8, -1))  # warm-up: connections, the database, code paths
        rows: list[tuple[str, dict[str, float]]] = []
        for round_no in range(args.rounds):
            got = asyncio.run(run_chat(bases, metrics_url, args.turns, round_no))
            rows.extend(got)
            print(f"  round {round_no}: {len(got)} turns", file=sys.stderr)
        print(report(rows, args.rounds, args.turns, f", managed proxy from {args.tree}" if args.tree else "",
                     stages=args.stages == "yes"))
    finally:
        for server in servers:
            server.stop()
        emulator.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
