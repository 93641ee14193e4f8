"""The peers benchmark's pure parts: records summed into rows, the table, the CPU target, the client's loop."""

from __future__ import annotations

import json

import pytest

from loadtests.peer_lanes import Conversation
from loadtests.peer_venvs import PEERS, ensure_peer, pinned_version
from loadtests.peers_report import (LITELLM, MANAGED, PASS, RequestRecord, Row, Totals, cpu_target, markdown,
                                    percentile, summarise)
from loadtests.workloads import agent, chat


def _records(pairs: list[tuple[float, float]], cpu: float = 0.002) -> list[RequestRecord]:
    return [RequestRecord(i, through, direct, cpu) for i, (through, direct) in enumerate(pairs)]


def test_percentile_is_nearest_rank_of_unsorted_values():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(v) for v in range(101)], 0.99) == 99.0


def test_a_row_sums_cpu_latency_and_upstream_tokens():
    records = _records([(0.010, 0.004), (0.020, 0.005), (0.030, 0.006)])
    records.append(RequestRecord(3, 0.5, 0.004, 0.001, error="500 boom"))
    row = summarise("chat", MANAGED, records, run_cpu_seconds=0.030, totals=Totals(5, 10_000, 7_500),
                    database_cpu_seconds=0.006)
    assert (row.requests, row.errors) == (4, 1)
    assert row.cpu_ms_per_request == pytest.approx(10.0)  # 30 ms over the 3 answered requests
    assert row.database_cpu_ms_per_request == pytest.approx(2.0)
    assert row.cpu_ms_in_requests == pytest.approx(7 / 3)  # 2+2+2+1 ms within requests, per answered request
    assert row.p50_ms == pytest.approx(20.0)
    assert row.added_p50_ms == pytest.approx(15.0)  # differences 6, 15, 24 ms: the failed request is left out
    assert row.added_p99_ms == pytest.approx(24.0)
    assert (row.upstream_requests, row.prompt_tokens) == (5, 10_000)
    assert row.prompt_tokens_per_request == pytest.approx(10_000 / 3)
    assert row.cached_share == pytest.approx(0.75)


def test_a_request_whose_direct_twin_failed_has_no_added_latency():
    row = summarise("agent", PASS, [RequestRecord(0, 0.01, None, 0.0)], 0.0, Totals())
    assert row.p50_ms == pytest.approx(10.0) and row.added_p50_ms is None and row.cached_share is None


def test_a_target_that_answered_nothing_has_no_figures():
    row = summarise("chat", PASS, [RequestRecord(0, 0.01, 0.01, 0.0, error="502")], 0.01, Totals())
    assert row.errors == 1 and row.cpu_ms_per_request is None and row.p50_ms is None


def test_the_table_has_a_line_per_row_and_dashes_for_missing_figures():
    rows = [summarise("chat", PASS, _records([(0.01, 0.005)]), 0.004, Totals(1, 1234, 617)),
            Row("agent", LITELLM), Row("agent", MANAGED, cpu_ms_per_request=9.0, database_cpu_ms_per_request=2.5)]
    table = markdown(rows).splitlines()
    assert len(table) == 5 and table[1].startswith("|---|")
    assert table[0].count("|") == table[2].count("|") == table[3].count("|") == table[4].count("|")
    assert "| chat | proxy (pass-through) | 1 | 0 | 4.00 | 2.00 | 10.00 | 5.00 | 5.00 | 1 | 1,234 | 1234 | 50.0% |" \
        == table[2]
    assert table[3].endswith("| - | - | - | 0 | 0 | - | - |")
    assert "| agent | proxy (managed) | 0 | 0 | 9.00 (2.50) | - |" in table[4]


def test_the_cpu_target_is_at_most_on_chat_and_below_on_agent():
    rows = [Row("chat", MANAGED, cpu_ms_per_request=5.0), Row("chat", LITELLM, cpu_ms_per_request=5.0),
            Row("agent", MANAGED, cpu_ms_per_request=5.0), Row("agent", LITELLM, cpu_ms_per_request=5.0)]
    lines = cpu_target(rows)
    assert lines[0].endswith(": met") and "1.00x" in lines[0]
    assert lines[1].endswith(": NOT met")  # equal is not below
    assert cpu_target([Row("chat", MANAGED, cpu_ms_per_request=1.0)])[0] == \
        "- chat: no managed and LiteLLM rows to compare"


def _tool_answer(body: dict) -> dict:
    """What the emulator answers an agent body: the call whose marker leads the newest message (none: text)."""
    text = body["messages"][-1]["content"]
    if "[[call:" not in text:
        return {"role": "assistant", "content": "Finished."}
    marker = text[text.index("[[call:") + 7:text.index("]]")]
    name, args = marker.split(" ", 1)
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": f"c{len(body['messages'])}", "type": "function",
                            "function": {"name": name, "arguments": args}}]}


def test_the_agent_loop_sends_one_request_per_scripted_output():
    workload = agent(turns=6, output_chars=(100, 200))
    conversation, bodies = Conversation(workload), []
    while conversation.body is not None:
        bodies.append(conversation.body)
        conversation.answer(_tool_answer(conversation.body))
    assert len(bodies) == workload.requests == 6 and conversation.breaks == 0
    assert [m["role"] for m in bodies[-1]["messages"]][:4] == ["system", "user", "assistant", "tool"]
    assert all(b["tools"] for b in bodies) and json.dumps(bodies)


def test_a_broken_tool_loop_pastes_the_outputs_and_keeps_the_request_count():
    workload = agent(turns=5, output_chars=(100, 200))
    conversation, count = Conversation(workload), 0
    while conversation.body is not None:
        count += 1
        conversation.answer(None)  # failures or plain text: no tool call ever comes back
    assert count == workload.requests and conversation.breaks == 4


def test_a_chat_resends_the_whole_history_each_turn():
    workload = chat(turns=4)
    conversation, sizes = Conversation(workload), []
    while conversation.body is not None:
        sizes.append(len(conversation.body["messages"]))
        conversation.answer({"role": "assistant", "content": "Sure.", "extra": "dropped"})
    assert sizes == [2, 4, 6, 8]


def test_peer_versions_are_pinned_and_a_missing_peer_is_reported_without_installing(tmp_path):
    assert all(pinned_version(p.requirement) for p in PEERS.values())
    result = ensure_peer(PEERS["headroom"], tmp_path, install=False)
    assert result.executable is None and "not installed" in result.reason
    assert not (tmp_path / "headroom-venv").exists()



def test_a_peer_whose_install_fails_is_reported_with_pip_s_reason(tmp_path, monkeypatch):
    import subprocess

    from loadtests import peer_venvs

    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Location 'x' is ignored: it is neither a file nor a "
                                                       "directory.\nERROR: No matching distribution found for x\n")

    monkeypatch.setattr(peer_venvs.subprocess, "run", failing)
    result = ensure_peer(PEERS["litellm"], tmp_path, install=True, log=lambda message: None)
    assert result.executable is None
    assert result.reason == (f"install of {PEERS['litellm'].requirement} failed: exit 1: "
                             "ERROR: No matching distribution found for x")


def test_a_real_servers_totals_come_from_its_own_counters(monkeypatch) -> None:
    import httpx

    from loadtests import peers

    text = ('sglang:prompt_tokens_total{engine_type="unified",is_streaming="false",model_name="m"} 300.0\n'
            'sglang:prompt_tokens_total{engine_type="unified",is_streaming="true",model_name="m"} 100.0\n'
            'sglang:cached_tokens_total{engine_type="unified",model_name="m"} 250.0\n'
            'sglang:num_requests_total{engine_type="unified",is_streaming="false",model_name="m"} 4.0\n'
            'sglang:prompt_tokens_histogram_sum{model_name="m"} 400.0\n')
    seen: list[str] = []

    def fake_get(url: str, timeout: float) -> httpx.Response:
        seen.append(url)
        return httpx.Response(200, text=text)

    monkeypatch.setattr(peers.httpx, "get", fake_get)
    totals = peers.engine_totals("http://127.0.0.1:31000")
    assert (totals.requests, totals.prompt_tokens, totals.cached_tokens) == (4, 400, 250)
    assert seen == ["http://127.0.0.1:31000/metrics"]
