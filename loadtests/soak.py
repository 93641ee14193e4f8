"""Soak: Locust users hold conversations through one proxy (real Redis and PostgreSQL) while Redis is restarted once
midway; afterwards every user message a client got an answer for must be stored, with zero 5xx from the proxy.
Samples the proxy's RSS (and the bytes its bounded caches report) every minute, with a progress line each time;
the report gives RSS by minute, its spread over the second half ((max - min) / mean) and the largest deviation
from the second half's mean (the goal: within +-5%).

    python -m loadtests.soak --users 100 --minutes 10 --json /tmp/soak.json   # the 10-minute soak
    python -m loadtests.soak --users 30 --minutes 2 --sample-s 20             # a short check that it works

The same file is the locustfile (Locust imports it): each user keeps one conversation for SOAK_TURNS turns,
sending the whole history every turn, and appends every answered user message to the ledger SOAK_LEDGER.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from locust import HttpUser, between, task

REPO = Path(__file__).resolve().parents[1]
FILLER = "river stone cloud maple lantern orbit copper meadow signal harbor velvet ember".split()
_ledger_lock = threading.Lock()


def _ledger_write(record: dict) -> None:
    path = os.environ.get("SOAK_LEDGER")
    if not path:
        return
    with _ledger_lock, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


class ConversationUser(HttpUser):
    wait_time = between(float(os.environ.get("SOAK_THINK_MIN", "0.5")), float(os.environ.get("SOAK_THINK_MAX", "2")))
    turns = int(os.environ.get("SOAK_TURNS", "30"))
    pad = int(os.environ.get("SOAK_PAD", "150"))

    def on_start(self) -> None:
        self.new_conversation()

    def new_conversation(self) -> None:
        self.name = uuid.uuid4().hex[:12]
        self.messages: list[dict] = [{"role": "system", "content": "You are terse."}]
        self.turn = 0

    @task
    def talk(self) -> None:
        if self.turn >= self.turns:
            self.new_conversation()
        filler = " ".join(FILLER[(self.turn + i) % len(FILLER)] for i in range(self.pad))
        text = f"Turn {self.turn} of {self.name}. {filler} [[len:40]]"
        body = {"model": "m", "messages": [*self.messages, {"role": "user", "content": text}], "max_tokens": 64}
        with self.client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-soak"},
                              name="chat", catch_response=True, timeout=120) as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}: {r.text[:200]}")
                _ledger_write({"status": r.status_code, "name": self.name, "turn": self.turn})
                return
            answer = r.json()["choices"][0]["message"]["content"]
            conversation = r.headers.get("x-memci-conversation-id")
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
        _ledger_write({"status": 200, "name": self.name, "turn": self.turn, "conversation": conversation,
                       "text": text})
        self.turn += 1


# --- the orchestrator ----------------------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (granian workers), in MB."""
    import psutil

    proc = psutil.Process(pid)
    return round(sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20, 1)


def check_ledger(ledger: Path, database_url: str) -> dict:
    import psycopg

    from memci_proxy.store.sql.urls import to_libpq_url

    answered: dict[str, list[str]] = {}
    statuses: dict[int, int] = {}
    for line in ledger.read_text().splitlines():
        record = json.loads(line)
        statuses[record["status"]] = statuses.get(record["status"], 0) + 1
        if record["status"] == 200:
            answered.setdefault(record["name"], []).append(record["text"])
    lost = 0
    with psycopg.connect(to_libpq_url(database_url)) as conn:
        stored_texts = {
            row[0] for row in conn.execute("SELECT message->>'content' FROM entries WHERE role = 'user'").fetchall()
        }
    for texts in answered.values():
        lost += sum(1 for t in texts if t not in stored_texts)
    return {"statuses": statuses, "conversations": len(answered),
            "messages_answered": sum(len(t) for t in answered.values()), "messages_lost": lost}


def ledger_counts(ledger: Path) -> tuple[int, int]:
    """(answered, failed) requests so far."""
    if not ledger.exists():
        return 0, 0
    answered = failed = 0
    for line in ledger.read_text().splitlines():
        if '"status": 200' in line:
            answered += 1
        else:
            failed += 1
    return answered, failed


def cache_figures(proxy_url: str) -> dict[str, dict[str, float]]:
    """The proxy's bounded caches (memci_cache_entries / memci_cache_bytes by cache)."""
    import httpx

    out: dict[str, dict[str, float]] = {}
    try:
        text = httpx.get(proxy_url + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        for metric in ("memci_cache_entries", "memci_cache_bytes"):
            if line.startswith(metric + "{"):
                name = line.split('cache="', 1)[1].split('"', 1)[0]
                out.setdefault(name, {})[metric[len("memci_cache_"):]] = float(line.rsplit(" ", 1)[1])
    return out


def spread_pct(values: list[float]) -> float | None:
    """(max - min) / mean, in percent: how flat a stretch of RSS samples is."""
    if len(values) < 2:
        return None
    return round(100 * (max(values) - min(values)) / statistics.mean(values), 2)


def deviation_pct(values: list[float]) -> float | None:
    """The largest distance of a sample from the stretch's mean, in percent of it (the goal's "within +-5%")."""
    if len(values) < 2:
        return None
    mean = statistics.mean(values)
    return round(100 * max(abs(v - mean) for v in values) / mean, 2)


def main() -> None:
    from loadtests.progress import Progress, bars_wanted
    from loadtests.progress import add_argument as add_progress_argument
    from memci_proxy.emulator.config import EmulatorConfig
    from memci_proxy.emulator.testing import running_emulator
    from tests.e2e.proxyproc import ProxyProcess
    from tests.resilience.conftest import PostgresProcess, RedisProcess

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--redis-down-s", type=float, default=5.0, help="how long Redis stays down midway")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between RSS samples (default: a minute)")
    parser.add_argument("--json", dest="json_out", help="write the report here too")
    add_progress_argument(parser)
    args = parser.parse_args()
    seconds = int(args.minutes * 60)

    work = Path(tempfile.mkdtemp(prefix="memci-soak-"))
    ledger = work / "ledger.jsonl"
    pg = PostgresProcess().start()
    redis = RedisProcess().start()
    proxy = None
    try:
        database = pg.create_database("soak")
        with running_emulator(EmulatorConfig(max_model_len=8192)) as upstream:
            proxy = ProxyProcess(upstream, work / "home", {"DATABASE_URL": database, "REDIS_URL": redis.url}).start()
            env = {**os.environ, "SOAK_LEDGER": str(ledger), "PYTHONPATH": str(REPO)}
            locust = subprocess.Popen(
                [sys.executable, "-m", "locust", "-f", str(Path(__file__).resolve()), "--headless", "-u",
                 str(args.users), "-r", str(max(1, args.users // 10)), "-t", f"{seconds}s", "--host", proxy.url,
                 "--only-summary", "--csv", str(work / "locust")],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            started = time.monotonic()
            samples = [{"minute": 0.0, "rss_mb": rss_mb(proxy.proc.pid), "answered": 0, "failed": 0}]
            redis_restarted_at = None
            next_sample = args.sample_s
            bar = Progress(seconds, f"soak, {args.users} users", bars=bars_wanted(args.progress), unit="s")
            while locust.poll() is None:
                elapsed = time.monotonic() - started
                bar.update(min(seconds, int(elapsed)))
                if redis_restarted_at is None and elapsed >= seconds / 2:
                    print(f"[soak] {elapsed / 60:.1f} min: restarting Redis ({args.redis_down_s:g} s down)",
                          flush=True)
                    redis.kill()
                    time.sleep(args.redis_down_s)
                    redis.start()
                    redis_restarted_at = round(elapsed / 60, 2)
                    continue
                if elapsed >= next_sample:
                    answered, failed = ledger_counts(ledger)
                    caches = cache_figures(proxy.url)
                    sample = {"minute": round(elapsed / 60, 2), "rss_mb": rss_mb(proxy.proc.pid),
                              "answered": answered, "failed": failed,
                              "cache_mb": round(sum(max(0.0, c.get("bytes", 0.0)) for c in caches.values()) / 2**20, 1)}
                    samples.append(sample)
                    print(f"[soak] {sample['minute']:.1f}/{args.minutes:g} min: proxy RSS {sample['rss_mb']} MB, "
                          f"{answered} answered, {failed} failed, measured caches {sample['cache_mb']} MB", flush=True)
                    next_sample += args.sample_s
                time.sleep(min(1.0, max(0.05, next_sample - elapsed)))
            bar.close()
            time.sleep(2)  # the last streams' turns are stored
            answered, failed = ledger_counts(ledger)
            samples.append({"minute": round((time.monotonic() - started) / 60, 2), "rss_mb": rss_mb(proxy.proc.pid),
                            "answered": answered, "failed": failed})
            log = proxy.log_path.read_text(errors="replace")
            half = [s["rss_mb"] for s in samples if s["minute"] >= args.minutes / 2]
            report = {
                "users": args.users, "minutes": args.minutes, **check_ledger(ledger, database),
                "rss_mb_by_minute": [(s["minute"], s["rss_mb"]) for s in samples],
                "proxy_rss_mb_start": samples[0]["rss_mb"], "proxy_rss_mb_end": samples[-1]["rss_mb"],
                "rss_spread_second_half_pct": spread_pct(half),
                "rss_deviation_second_half_pct": deviation_pct(half),
                "samples": samples, "caches_at_end": cache_figures(proxy.url),
                "redis_restarted_at_minute": redis_restarted_at,
                "redis_outage_logged": "Redis unreachable" in log, "redis_recovery_logged": "Redis reachable again" in log,
                "unhandled_errors_logged": log.count("unhandled error"), "stale_state_logged": log.count("newer state"),
                "work_dir": str(work),
            }
            text = json.dumps(report, indent=2)
            print(text)
            if args.json_out:
                Path(args.json_out).write_text(text)
    finally:
        if proxy is not None:
            proxy.stop()
        redis.kill()
        pg.close()


if __name__ == "__main__":
    main()
