"""Two proxy replicas sharing one Redis and one PostgreSQL, turns alternating between them (client-side round
robin): every upstream prompt must be identical to the one a single replica sends for the same conversation.

    python -m loadtests.replicas --conversations 50 --turns 12

Starts an emulator (8k window), an embedded PostgreSQL (pgserver, passed to the proxies as DATABASE_URL), a
redis-server and the proxies, the memory workers on as by default (``--memory-workers off``). Run A: one replica;
run B: two replicas, turn i of every conversation on replica i % 2 (``--baseline one``: one replica again, how far
one proxy differs from itself). The emulator's request log is polled during each run and the prompts are matched by
(conversation, turn); the memory workers' requests are kept apart. Prints JSON: mismatches, hit rates, statuses,
lock timeouts and the lock wait p99 of run B, the summary calls (prefix, plain) and the epochs' waits for late
summary jobs of each run. ``--dump DIR`` writes both runs' prompts and jobs, to diff.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MAX_TOKENS = 128
FILLER = "river stone cloud maple lantern orbit copper meadow signal harbor velvet ember".split()
_TURN = re.compile(r"Turn (\d+) of (conv-\d+):")


def user_text(name: str, turn: int, pad: int) -> str:
    filler = " ".join(FILLER[(turn + i) % len(FILLER)] for i in range(pad))
    return f"Turn {turn} of {name}: remember item {turn}. {filler} Tell me more. [[len:60]]"


@dataclass
class RunResult:
    statuses: Counter = field(default_factory=Counter)
    prompts: dict[tuple[str, int], Any] = field(default_factory=dict)
    jobs: list[Any] = field(default_factory=list)  # the memory workers' requests (summaries, profiles), in order
    seconds: float = 0.0
    hit_rate: float = 0.0  # the upstream's cached prompt tokens over its prompt tokens, over the run


class PromptRecorder:
    """Polls the emulator's request log (a ring of 200) and keeps every request body by its id."""

    def __init__(self, emulator_root: str, interval_s: float = 0.3) -> None:
        self.url = emulator_root + "/emulator/requests"
        self.interval_s = interval_s
        self.bodies: dict[str, dict[str, Any]] = {}
        self._task: asyncio.Task | None = None

    async def _poll_once(self, client: httpx.AsyncClient) -> None:
        r = await client.get(self.url, params={"n": 200}, timeout=10)
        for item in r.json()["data"]:
            self.bodies.setdefault(str(item.get("request_id")), item["body"])

    async def _loop(self) -> None:
        async with httpx.AsyncClient() as client:
            while True:
                await self._poll_once(client)
                await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    def jobs(self) -> list[Any]:
        from memci_proxy.workers.prefix import is_job_body

        return [body for body in self.bodies.values() if is_job_body(body)]

    async def stop(self) -> dict[tuple[str, int], Any]:
        assert self._task is not None
        self._task.cancel()
        async with httpx.AsyncClient() as client:
            await self._poll_once(client)
        out: dict[tuple[str, int], Any] = {}
        for body in self.bodies.values():
            last = (body.get("messages") or [{}])[-1]
            # A turn's request ends with its user message, which starts with "Turn N of conv-M:"; the memory
            # workers' jobs end with an instruction that quotes turns (the proxy's block may lead the user message,
            # quoting earlier turns in its contents page: read what follows it).
            text = str(last.get("content")).rsplit("</memci-context>", 1)[-1].lstrip()
            matches = _TURN.findall(text) if last.get("role") == "user" else []
            match = _TURN.match(text) if len(matches) == 1 else None
            if match:
                out[(match.group(2), int(match.group(1)))] = {"messages": body["messages"], "tools": body.get("tools")}
        return out


async def _conversation(client: httpx.AsyncClient, proxies: list[str], api_key: str, name: str, turns: int,
                        pad: int, result: RunResult) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    headers = {"Authorization": f"Bearer {api_key}"}
    for turn in range(turns):
        base = proxies[turn % len(proxies)]
        text = user_text(name, turn, pad)
        body = {"model": "m", "messages": [*messages, {"role": "user", "content": text}], "max_tokens": MAX_TOKENS}
        r = await client.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=120)
        result.statuses[r.status_code] += 1
        if r.status_code != 200:
            return
        messages += [{"role": "user", "content": text},
                     {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}]


async def run(proxies: list[str], emulator_root: str, api_key: str, conversations: int, turns: int,
              pad: int) -> RunResult:
    httpx.post(emulator_root + "/emulator/reset", timeout=10).raise_for_status()
    result = RunResult()
    recorder = PromptRecorder(emulator_root)
    recorder.start()
    started = time.perf_counter()
    limits = httpx.Limits(max_connections=conversations + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(*(_conversation(client, proxies, api_key, f"conv-{i}", turns, pad, result)
                               for i in range(conversations)))
    result.seconds = time.perf_counter() - started
    result.prompts = await recorder.stop()
    result.jobs = recorder.jobs()
    result.hit_rate = httpx.get(emulator_root + "/emulator/stats", timeout=10).json()["cache_hit_rate"]
    return result


def compare(one: RunResult, two: RunResult) -> list[tuple[str, int]]:
    """The (conversation, turn) keys whose upstream prompts differ (or are missing from either run)."""
    keys = set(one.prompts) | set(two.prompts)
    return sorted(k for k in keys if one.prompts.get(k) != two.prompts.get(k))


def histogram_quantile(metrics_texts: list[str], name: str, q: float) -> float | None:
    """The q-quantile (upper bucket bound) of a histogram summed over several /metrics pages."""
    buckets: Counter = Counter()
    for text in metrics_texts:
        for line in text.splitlines():
            if line.startswith(name + "_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                buckets[float("inf") if le == "+Inf" else float(le)] += float(line.rsplit(" ", 1)[1])
    if not buckets:
        return None
    total = buckets[float("inf")]
    if total == 0:
        return None
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return None


def metric_sum(metrics_texts: list[str], name: str) -> float:
    total = 0.0
    for text in metrics_texts:
        for line in text.splitlines():
            if line.split("{")[0].split(" ")[0] == name:
                total += float(line.rsplit(" ", 1)[1])
    return total


def labelled_sum(metrics_texts: list[str], name: str, label: str, value: str) -> float:
    wanted = f'{label}="{value}"'
    return sum(float(line.rsplit(" ", 1)[1]) for text in metrics_texts for line in text.splitlines()
               if line.startswith(name + "{") and wanted in line.split("}", 1)[0])


def replica_report(proxies: list[str]) -> dict[str, Any]:
    texts = [httpx.get(p + "/metrics", timeout=10).text for p in proxies]
    return {
        "lock_wait_p99_s": histogram_quantile(texts, "memci_lock_wait_seconds", 0.99),
        "lock_wait_p50_s": histogram_quantile(texts, "memci_lock_wait_seconds", 0.50),
        "lock_waits": metric_sum(texts, "memci_lock_wait_seconds_count"),
        "lock_timeouts": metric_sum(texts, "memci_lock_timeouts_total"),
        "engine_errors": metric_sum(texts, "memci_engine_errors_total"),
        "summary_calls": {kind: labelled_sum(texts, "memci_summary_calls_total", "kind", kind)
                          for kind in ("prefix", "plain")},
        "summary_waits": {outcome: labelled_sum(texts, "memci_summary_waits_total", "outcome", outcome)
                          for outcome in ("ready", "behind", "failed")},
    }


def dump_prompts(directory: Path, one: RunResult, two: RunResult) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, result in (("one", one), ("two", two)):
        data = {f"{conv}/{turn}": prompt for (conv, turn), prompt in sorted(result.prompts.items())}
        (directory / f"{name}.json").write_text(json.dumps(data, indent=1, ensure_ascii=False))
        (directory / f"{name}-jobs.json").write_text(json.dumps(result.jobs, indent=1, ensure_ascii=False))


def main() -> None:
    from memci_proxy.emulator.config import EmulatorConfig
    from memci_proxy.emulator.testing import running_emulator
    from tests.e2e.proxyproc import ProxyProcess
    from tests.resilience.conftest import PostgresProcess, RedisProcess

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--pad", type=int, default=300, help="filler words per user message (epochs come sooner)")
    parser.add_argument("--memory-workers", choices=("on", "off"), default="on",
                        help="the memory workers (summaries, profile) on both replicas; on by default, as in a deployment")
    parser.add_argument("--baseline", choices=("two", "one"), default="two",
                        help="run B on two alternating replicas (default), or on one again: how far one proxy differs "
                             "from itself")
    parser.add_argument("--proxy-env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of both replicas (e.g. MEMCI_TOKENIZE_TIMEOUT_S=5)")
    parser.add_argument("--dump", type=Path, default=None,
                        help="write both runs' prompts (JSON, keyed by conversation and turn) to this directory")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the proxies, Redis and PostgreSQL too

    pg = PostgresProcess().start()
    redis = RedisProcess().start()
    home = Path(tempfile.mkdtemp(prefix="memci-replicas-"))
    proxies: list[ProxyProcess] = []
    try:
        database = pg.create_database("replicas")
        with running_emulator(EmulatorConfig(max_model_len=8192)) as upstream:
            root = upstream.removesuffix("/v1")
            env = {"DATABASE_URL": database, "REDIS_URL": redis.url,
                   "MEMCI_MEMORY_WORKERS": "true" if args.memory_workers == "on" else "false",
                   **dict(item.split("=", 1) for item in args.proxy_env)}
            for i in range(2):
                proxies.append(ProxyProcess(upstream, home / f"r{i}", env).start())
            urls = [p.url for p in proxies]
            one = asyncio.run(run(urls[:1], root, "sk-one-replica", args.conversations, args.turns, args.pad))
            report_one = replica_report(urls[:1])
            for p in proxies:  # the lock figures below are run B's alone
                p.stop()
                p.start()
            urls_b = urls if args.baseline == "two" else urls[:1]
            two = asyncio.run(run(urls_b, root, "sk-two-replicas", args.conversations, args.turns, args.pad))
            if args.dump:
                dump_prompts(args.dump, one, two)
            report = {
                "conversations": args.conversations, "turns": args.turns, "pad_words": args.pad,
                "memory_workers": args.memory_workers, "run_b_replicas": len(urls_b), "proxy_env": args.proxy_env,
                "prompts_compared": len(set(one.prompts) | set(two.prompts)),
                "mismatches": len(compare(one, two)),
                "hit_rate_one": round(one.hit_rate, 4), "hit_rate_two": round(two.hit_rate, 4),
                "statuses_one": dict(one.statuses), "statuses_two": dict(two.statuses),
                "seconds_one": round(one.seconds, 2), "seconds_two": round(two.seconds, 2),
                **replica_report(urls), "summary_calls_one": report_one["summary_calls"],
                "summary_waits_one": report_one["summary_waits"],
            }
            print(json.dumps(report, indent=2))
    finally:
        for p in proxies:
            p.stop()
        redis.kill()
        pg.close()


if __name__ == "__main__":
    main()
