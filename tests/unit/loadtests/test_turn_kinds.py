"""loadtests/turn_kinds.py sorts each managed turn by what it did from the proxy's own metrics text and headers."""

from __future__ import annotations

from prometheus_client import generate_latest

from loadtests.turn_kinds import DIRECT, MANAGED, PASS, counters, kind_of, report, stage_sums
from memci_proxy.metrics import Metrics


def test_the_counters_are_read_from_the_proxys_metrics_text():
    metrics = Metrics()
    assert counters(generate_latest(metrics.registry).decode()) == (0.0, 0.0)
    metrics.recall_pushes.labels("pushed").inc(3)
    metrics.recall_pushes.labels("no_hits").inc(5)  # weighed, not pushed: not counted
    metrics.recall_rounds.observe(2)
    metrics.recall_rounds.observe(0)
    assert counters(generate_latest(metrics.registry).decode()) == (3.0, 2.0)


def test_kinds():
    assert kind_of(False, False, False) == "plain"
    assert kind_of(False, True, False) == "push"
    assert kind_of(True, False, False) == "epoch"
    assert kind_of(True, True, False) == "epoch+push"
    assert kind_of(True, False, True) == "recall"
    assert kind_of(False, True, True) == "push+recall"


def test_the_report_sets_each_target_against_the_direct_answer():
    rows = [("plain", {DIRECT: 0.010, PASS: 0.011, MANAGED: 0.012})] * 50 + [
        ("push", {DIRECT: 0.010, PASS: 0.011, MANAGED: 0.020})] * 10
    text = report(rows, 1, 60)
    assert "| plain | 50 | +2.00 ms | +2.00 ms |" in text
    assert "| push | 10 | +10.00 ms | +10.00 ms |" in text
    assert "| pass-through | +1.00 ms | +1.00 ms |" in text
    assert "managed over pass-through: p50 +1.00 ms (target +2), p99 +9.00 ms (target +10)" in text


def test_the_stages_are_read_from_the_proxys_metrics_text():
    metrics = Metrics()
    metrics.child(metrics.turn_stage, "plan").observe(0.002)
    metrics.child(metrics.turn_stage, "plan").observe(0.001)
    metrics.child(metrics.turn_stage, "store").observe(0.004)
    sums = stage_sums(generate_latest(metrics.registry).decode())
    assert sums.keys() == {"plan", "store"}
    assert abs(sums["plan"] - 0.003) < 1e-9 and abs(sums["store"] - 0.004) < 1e-9


def test_the_report_shows_each_kinds_time_by_stage_and_its_slowest_tenth():
    plain = {DIRECT: 0.010, PASS: 0.011, MANAGED: 0.012, "stage:plan": 0.001, "stage:upstream": 0.010}
    slow = {**plain, MANAGED: 0.030, "stage:store": 0.015}
    rows = [("plain", plain)] * 18 + [("plain", slow)] * 2
    text = report(rows, 1, 20)
    header = next(line for line in text.splitlines() if line.startswith("| turn | of them"))
    assert header.split(" | ")[3:6] == ["edge", "lookup", "lock"]
    all_row = next(line for line in text.splitlines() if line.startswith("| plain | all (20)"))
    slowest = next(line for line in text.splitlines() if line.startswith("| plain | slowest tenth (2)"))
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    names = cells(header)
    assert dict(zip(names, cells(all_row)))["plan"] == "1.00" and dict(zip(names, cells(all_row)))["store"] == "0.00"
    assert dict(zip(names, cells(slowest)))["store"] == "15.00" and dict(zip(names, cells(slowest)))["added"] == "20.00"
    assert dict(zip(names, cells(slowest)))["direct"] == "10.00"
    assert "of them" not in report(rows, 1, 20, stages=False)
    assert "of them" not in report([("plain", {DIRECT: 0.01, PASS: 0.01, MANAGED: 0.01})], 1, 1)  # an older tree
