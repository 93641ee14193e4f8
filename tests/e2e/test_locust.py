"""A short headless Locust run (5 users, 15 s) through the proxy to the emulator: zero failures."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.e2e.proxyproc import REPO

# Locust is run in a process of its own and never imported here: importing it patches the threading of the whole test
# process with gevent's (its threads become greenlets on the main thread) for every test after this one.
if importlib.util.find_spec("locust") is None:
    pytest.skip("locust is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def proxy_8k(emulator_and_proxy):
    pair = emulator_and_proxy(8192)
    return pair.proxy, pair.emulator


def read_stats(prefix: str) -> dict[tuple[str, str], dict[str, str]]:
    with open(prefix + "_stats.csv", newline="") as fh:
        return {(row["Type"], row["Name"]): row for row in csv.DictReader(fh)}


def test_headless_run_through_the_proxy_has_no_failures(proxy_8k, tmp_path):
    proxy, emu = proxy_8k
    prefix = str(tmp_path / "run")
    summary_path = tmp_path / "summary.json"
    env = {**os.environ, "LOCUST_TURNS": "12", "LOCUST_THINK_MIN": "0.1", "LOCUST_THINK_MAX": "0.4",
           "LOCUST_ANSWER_TOKENS": "60", "LOCUST_SUMMARY_JSON": str(summary_path)}
    result = subprocess.run(
        [sys.executable, "-m", "locust", "-f", "loadtests/locustfile.py", "--headless", "-u", "5", "-r", "5",
         "-t", "15s", "--host", proxy.url, "--only-summary", "--csv", prefix, "--stop-timeout", "10"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stats = read_stats(prefix)
    total = stats[("", "Aggregated")]
    assert int(total["Failure Count"]) == 0, (total, result.stderr[-3000:])
    chat = stats[("POST", "chat")]
    assert int(chat["Request Count"]) >= 10
    ttft = stats[("TTFT", "first token")]
    assert int(ttft["Request Count"]) == int(chat["Request Count"])
    assert float(ttft["Median Response Time"]) > 0

    summary = json.loads(summary_path.read_text())
    assert summary["prompt_tokens"] > 0
    # multi-turn conversations through the proxy reuse the upstream's prefix cache
    assert summary["hit_rate"] is not None and summary["hit_rate"] > 0.5, summary
    assert "cache hit rate (usage)" in result.stdout + result.stderr
    assert emu.stats()["requests"] >= int(chat["Request Count"])
