"""loadtests/turn_kinds.py sorts each managed turn by what it did from the proxy's own metrics text and headers."""

from __future__ import annotations

from prometheus_client import generate_latest

from loadtests.turn_kinds import DIRECT, MANAGED, PASS, counters, kind_of, report
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
