"""Soak: Locust users hold conversations through one proxy (real Redis and PostgreSQL) while Redis is restarted once
midway; afterwards every user message a client got an answer for must be stored, with zero 5xx from the proxy.
Reports the proxy's RSS at the start and the end.

    python -m loadtests.soak --users 100 --minutes 10            # orchestrates everything, prints JSON
    python -m loadtests.soak --users 30 --minutes 3              # the short run

The same file is the locustfile (Locust imports it): each user keeps one conversation for SOAK_TURNS turns,
sending the whole history every turn, and appends every answered user message to the ledger SOAK_LEDGER.
"""

from __future__ import annotations

import argparse
import json
import os
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

    from proxy.store.sql.urls import to_libpq_url

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


def main() -> None:
    from proxy.emulator.config import EmulatorConfig
    from proxy.emulator.testing import running_emulator
    from tests.e2e.proxyproc import ProxyProcess
    from tests.resilience.conftest import PostgresProcess, RedisProcess

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--redis-down-s", type=float, default=5.0, help="how long Redis stays down midway")
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
            time.sleep(min(30, seconds / 6))
            rss_start = rss_mb(proxy.proc.pid)
            time.sleep(max(0, seconds / 2 - min(30, seconds / 6)))
            redis.kill()
            time.sleep(args.redis_down_s)
            redis.start()
            locust.wait(timeout=seconds + 120)
            time.sleep(2)  # the last streams' turns are stored
            rss_end = rss_mb(proxy.proc.pid)
            log = proxy.log_path.read_text(errors="replace")
            report = {
                "users": args.users, "minutes": args.minutes, **check_ledger(ledger, database),
                "proxy_rss_mb_start": rss_start, "proxy_rss_mb_end": rss_end,
                "redis_outage_logged": "Redis unreachable" in log, "redis_recovery_logged": "Redis reachable again" in log,
                "unhandled_errors_logged": log.count("unhandled error"), "stale_state_logged": log.count("newer state"),
                "work_dir": str(work),
            }
            print(json.dumps(report, indent=2))
    finally:
        if proxy is not None:
            proxy.stop()
        redis.kill()
        pg.close()


if __name__ == "__main__":
    main()
