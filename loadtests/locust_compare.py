"""Time to first token under load, strategy by strategy: one headless Locust run each, against fresh servers.

    python loadtests/locust_compare.py --users 50 --time 3m --per-uncached-token 0.0001

Targets: ``pass-through`` (straight to an emulator without a context limit: the unbounded reference),
``proxy`` (a ``memci-proxy serve`` in front of an emulator with the window), ``proxy-passthrough`` (the proxy
with ``MEMCI_MANAGE_CONTEXT=false`` in front of the unbounded emulator: what the proxy costs),
``sliding`` and ``three-tier`` (the baselines trimming on the client, straight to an emulator with the
window). Prints TTFT p50/p95/p99, failures, hit rate and TTFT by turn number as markdown.

With ``--upstream URL`` (a real SGLang server's /v1 URL, started with ``--enable-cache-report --enable-metrics``) the
proxy targets and pass-through use that server instead of an emulator (its radix cache flushed before each); the
table then has the engine's own hit rate beside the clients' and the proxy's: ``sglang:cached_tokens_total`` over
``sglang:prompt_tokens_total`` from its /metrics, and the proxy's ``memci_upstream_*`` plus
``memci_memory_job_*`` tokens from the proxy's /metrics, counted over the run.

    python loadtests/locust_compare.py --upstream http://127.0.0.1:30000/v1 --targets proxy --users 4 --time 4m \
        --turns 30 --answer-tokens 24 --max-tokens 24 --window 4096 --model smollm2
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from loadtests.bench_servers import REPO, counters, emulator_upstream, external_upstream, proxy_server
from loadtests.progress import Progress, bars_wanted, seconds_of
from loadtests.progress import add_argument as add_progress_argument
from loadtests.cache_bench import UNBOUNDED_WINDOW

TARGETS = ("pass-through", "proxy", "proxy-passthrough", "sliding", "three-tier")


def run_locust(host: str, args: argparse.Namespace, strategy: str, workdir: Path, name: str) -> dict:
    prefix = str(workdir / name)
    summary_path = workdir / f"{name}.json"
    env = {**os.environ, "LOCUST_TURNS": str(args.turns), "LOCUST_ANSWER_TOKENS": str(args.answer_tokens),
           "LOCUST_STRATEGY": strategy, "LOCUST_WINDOW": str(args.window), "LOCUST_SUMMARY_JSON": str(summary_path),
           "LOCUST_THINK_MIN": str(args.think[0]), "LOCUST_THINK_MAX": str(args.think[1]),
           "LOCUST_MAX_TOKENS": str(args.max_tokens), "LOCUST_MODEL": args.model}
    locust = subprocess.Popen([sys.executable, "-m", "locust", "-f", "loadtests/locustfile.py", "--headless", "-u",
                               str(args.users), "-r", str(args.spawn_rate), "-t", args.time, "--host", host,
                               "--only-summary", "--csv", prefix, "--stop-timeout", "30"],
                              cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = seconds_of(args.time)
    started = time.monotonic()
    with Progress(seconds, name, bars=bars_wanted(args.progress), unit="s") as bar:
        while locust.poll() is None:
            elapsed = time.monotonic() - started
            if elapsed > 3600:
                locust.kill()
                raise TimeoutError(f"locust against {name} ran past an hour")
            bar.update(min(seconds, int(elapsed)))
            time.sleep(0.5)
    with open(prefix + "_stats.csv", newline="") as fh:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(fh)}
    summary = json.loads(summary_path.read_text())
    ttft, chat = rows[("TTFT", "first token")], rows[("POST", "chat")]
    return {"target": name, "requests": int(chat["Request Count"]),
            "failures": int(rows[("", "Aggregated")]["Failure Count"]),
            "ttft_p50": float(ttft["50%"]), "ttft_p95": float(ttft["95%"]), "ttft_p99": float(ttft["99%"]),
            "rps": float(chat["Requests/s"]), **summary}


def measure(target: str, args: argparse.Namespace, workdir: Path) -> dict:
    if args.upstream:
        return measure_on_engine(target, args, workdir)
    extra = ("--per-uncached-token", str(args.per_uncached_token), "--per-output-token", str(args.per_output_token))
    bounded = target in ("proxy", "sliding", "three-tier")
    with emulator_upstream(args.window if bounded else UNBOUNDED_WINDOW, workdir, extra) as upstream:
        if target.startswith("proxy"):
            with proxy_server(upstream.base_url, workdir / f"home-{target}", proxy_env(target, args)) as base:
                return run_locust(base.removesuffix("/v1"), args, "none", workdir, target)
        strategy = target if target in ("sliding", "three-tier") else "none"
        return run_locust(upstream.root, args, strategy, workdir, target)


def proxy_env(target: str, args: argparse.Namespace) -> dict[str, str]:
    env = {"MEMCI_MANAGE_CONTEXT": "false"} if target == "proxy-passthrough" else {}
    env.update(dict(kv.split("=", 1) for kv in args.proxy_env))
    return env


ENGINE_COUNTERS = ("sglang:prompt_tokens_total", "sglang:cached_tokens_total")
PROXY_COUNTERS = ("memci_upstream_prompt_tokens_total", "memci_upstream_cached_tokens_total",
                  "memci_memory_job_prompt_tokens_total", "memci_memory_job_cached_tokens_total")


def measure_on_engine(target: str, args: argparse.Namespace, workdir: Path) -> dict:
    """One target against the real server: the clients' figures, and the hit rate on the engine's own counters
    (and the proxy's, for the proxy targets) over the run."""
    with external_upstream(args.upstream) as upstream:
        before = counters(upstream.root + "/metrics", ENGINE_COUNTERS)
        if target.startswith("proxy"):
            with proxy_server(upstream.base_url, workdir / f"home-{target}", proxy_env(target, args)) as base:
                row = run_locust(base.removesuffix("/v1"), args, "none", workdir, target)
                mine = counters(base.removesuffix("/v1") + "/metrics", PROXY_COUNTERS)
            prompt = mine["memci_upstream_prompt_tokens_total"] + mine["memci_memory_job_prompt_tokens_total"]
            cached = mine["memci_upstream_cached_tokens_total"] + mine["memci_memory_job_cached_tokens_total"]
            row["proxy_metrics_hit_rate"] = cached / prompt if prompt else None
        else:
            strategy = target if target in ("sliding", "three-tier") else "none"
            row = run_locust(upstream.root, args, strategy, workdir, target)
        after = counters(upstream.root + "/metrics", ENGINE_COUNTERS)
    prompt = after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"]
    cached = after["sglang:cached_tokens_total"] - before["sglang:cached_tokens_total"]
    row["engine_hit_rate"] = cached / prompt if prompt else None
    return row


def markdown(results: list[dict]) -> str:
    out = ["| target | requests | failures | req/s | TTFT p50 ms | p95 | p99 | hit rate | output tok/s |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        hit = "n/a" if r["hit_rate"] is None else f"{r['hit_rate']:.4f}"
        out.append(f"| {r['target']} | {r['requests']} | {r['failures']} | {r['rps']:.1f} | {r['ttft_p50']:.0f} | "
                   f"{r['ttft_p95']:.0f} | {r['ttft_p99']:.0f} | {hit} | {r['output_tokens_per_s_total'] or 0:.0f} |")
    if any("engine_hit_rate" in r for r in results):
        out += ["", "| target | hit rate, clients' usage | proxy's /metrics (jobs included) | the engine's own counters |",
                "| --- | ---: | ---: | ---: |"]
        for r in results:
            cells = [r.get(k) for k in ("hit_rate", "proxy_metrics_hit_rate", "engine_hit_rate")]
            out.append(f"| {r['target']} | " + " | ".join("n/a" if c is None else f"{c:.4f}" for c in cells) + " |")
    buckets = list(dict.fromkeys(k for r in results for k in r["ttft_by_turn"]))
    out += ["", "TTFT p50 (ms) by turn number:", "",
            "| turns | " + " | ".join(r["target"] for r in results) + " |",
            "| --- |" + " ---: |" * len(results)]
    for b in buckets:
        cells = [f"{r['ttft_by_turn'][b]['p50_ms']:.0f}" if b in r["ttft_by_turn"] else "" for r in results]
        out.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--users", type=int, default=50)
    p.add_argument("--spawn-rate", type=float, default=10)
    p.add_argument("--time", default="3m")
    p.add_argument("--turns", type=int, default=80, help="turns per conversation")
    p.add_argument("--answer-tokens", type=int, default=120)
    p.add_argument("--think", type=float, nargs=2, default=(0.5, 2.0))
    p.add_argument("--window", type=int, default=8192)
    p.add_argument("--per-uncached-token", type=float, default=0.0001)
    p.add_argument("--per-output-token", type=float, default=0.0)
    p.add_argument("--proxy-env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--max-tokens", type=int, default=256, help="the requests' max_tokens")
    p.add_argument("--model", default="memci-emulator", help="model name sent (a real server's served model)")
    p.add_argument("--upstream", default=None,
                   help="a real SGLang server's /v1 URL instead of emulators (flushed before each target)")
    p.add_argument("--json", dest="json_out")
    add_progress_argument(p)
    args = p.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="locust-compare-") as tmp:
        for target in [t.strip() for t in args.targets.split(",") if t.strip()]:
            print(f"# {target} ...", file=sys.stderr, flush=True)
            results.append(measure(target, args, Path(tmp)))
    print(markdown(results))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
