"""The cache benchmark on a quick configuration (60 turns, 4k window): the table's invariants hold."""

from __future__ import annotations

import json

import pytest

from loadtests import cache_bench
from loadtests.workloads import make_workload


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def chat_rows(bench_dir) -> dict[str, dict]:
    out = bench_dir / "bench.json"
    assert cache_bench.main(["--quick", "--workloads", "chat", "--json", str(out), "--plots", str(bench_dir / "plots")]) == 0
    data = json.loads(out.read_text())
    assert data["window"] == 4096
    return {row["strategy"]: row for row in data["workloads"]["chat"]}


def test_every_strategy_ran_the_whole_workload(chat_rows):
    workload = make_workload("chat", 60, 0)
    assert set(chat_rows) == {"pass-through", "sliding window", "three-tier", "this proxy"}
    for row in chat_rows.values():
        assert row["requests"] == workload.requests
        assert len(row["per_request"]) == workload.requests


def test_the_proxy_never_exceeds_the_budget(chat_rows):
    budget = cache_bench.budget_of(4096, 256)
    proxy = chat_rows["this proxy"]
    bad = [r for r in proxy["per_request"] if r["error"] or r["prompt_largest"] > budget]
    assert not bad, f"requests over the budget {budget} or failed: {bad}"
    assert proxy["errors"] == 0
    assert proxy["over_budget"] == 0
    assert proxy["prompt_max"] <= budget
    assert all(r["prompt_largest"] <= budget for r in proxy["per_request"])
    assert proxy["epochs"] >= 1  # 60 turns do not fit a 4k window: the proxy had to compact


def test_the_proxy_keeps_the_cache_hotter_than_both_baselines(chat_rows):
    proxy = chat_rows["this proxy"]["hit_rate"]
    assert proxy > chat_rows["sliding window"]["hit_rate"]
    assert proxy > chat_rows["three-tier"]["hit_rate"]
    assert chat_rows["this proxy"]["uncached_mean"] < chat_rows["sliding window"]["uncached_mean"]


def test_pass_through_is_the_unbounded_ceiling(chat_rows):
    passthrough = chat_rows["pass-through"]
    assert passthrough["errors"] == 0
    assert passthrough["over_budget"] > 0  # its prompt grew past the budget: nothing was trimmed
    assert passthrough["hit_rate"] >= max(r["hit_rate"] for r in chat_rows.values())
    assert passthrough["uncached_mean"] <= 1.2 * passthrough["adds_mean"] + 2  # only the new turn is prefilled


def test_recall_probes_are_reported(chat_rows):
    # pass-through sends everything, so every probe's value is in its prompt
    probes = make_workload("chat", 60, 0).probes
    assert probes > 0
    assert chat_rows["pass-through"]["recall"] == f"{probes}/{probes}"


def test_the_benchmark_draws_a_plot_per_workload(chat_rows, bench_dir):
    plots = list((bench_dir / "plots").iterdir())
    assert [p.name for p in plots] == ["cache_bench-chat.png"]
    data = plots[0].read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000  # two panels of four strategies' lines

def test_proxy_rows_per_source_and_workers_setting():
    import argparse

    variants = cache_bench.proxy_variants(argparse.Namespace(proxy_src=[], workers=""))
    assert [v.name() for v in variants] == ["this proxy"] and variants[0].env() == {}
    variants = cache_bench.proxy_variants(argparse.Namespace(proxy_src=["before=/tmp/a", "after=."], workers="off,on"))
    assert [v.name() for v in variants] == ["this proxy [before] (workers off)", "this proxy [before] (workers on)",
                                            "this proxy [after] (workers off)", "this proxy [after] (workers on)"]
    assert variants[1].env() == {"MEMCI_MEMORY_WORKERS": "true"} and str(variants[0].src) == "/tmp/a"
    with pytest.raises(SystemExit):
        cache_bench.proxy_variants(argparse.Namespace(proxy_src=[], workers="maybe"))
