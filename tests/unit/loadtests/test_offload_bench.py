"""cache_bench's ceiling column (1 - 2d/H from the prompts as sent) and the agent-large workload."""

from __future__ import annotations

from loadtests.cache_bench import RequestRecord, summarise
from loadtests.workloads import make_workload


def test_the_ceiling_reads_what_each_request_adds_between_epochs() -> None:
    records = [RequestRecord(0, prompt=1000, cached=0, prompt_largest=1000),
               RequestRecord(1, prompt=1200, cached=1000, prompt_largest=1200),
               RequestRecord(2, prompt=1400, cached=1200, prompt_largest=1400),
               RequestRecord(3, prompt=600, cached=100, prompt_largest=600, epoch=True),
               RequestRecord(4, prompt=800, cached=600, prompt_largest=800)]
    row = summarise("x", records, 10_000, 1.0, True)
    assert row.sent_adds_mean == 200 and row.prompt_max == 1400
    assert abs(row.ceiling - (1 - 400 / 1400)) < 1e-9


def test_agent_large_outputs_are_5_to_50k_tokens() -> None:
    workload = make_workload("agent-large", 12, 3)
    results = workload.turns[0].tool_results
    assert len(results) == 11 and workload.requests == 12
    assert all(5_000 * 4 <= len(r) <= 50_000 * 4 + 400 for r in results)
    assert results[0].startswith("[[call:") and results[-1].startswith("All tests pass now.")
    assert any("error:" in r or "Traceback" in r for r in results)
