"""The peers benchmark on five requests per workload, this proxy only: the peers asked for but not installed are
skipped with their reason, and the table still comes out."""

from __future__ import annotations

import json

import pytest

from loadtests import peers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("peers") / "peers.json"
    empty_cache = tmp_path_factory.mktemp("no-peers")
    code = peers.main(["--targets", "passthrough,managed,litellm,headroom", "--turns", "5", "--no-install",
                       "--cache-dir", str(empty_cache), "--settle", "0.5", "--json", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_this_proxy_ran_both_workloads_without_errors(result):
    rows = {(r["workload"], r["target"]): r for r in result["rows"]}
    assert set(rows) == {(w, t) for w in ("chat", "agent") for t in ("proxy (pass-through)", "proxy (managed)")}
    for row in rows.values():
        assert row["requests"] == 5 and row["errors"] == 0
        assert row["cpu_ms_per_request"] is not None and row["cpu_ms_in_requests"] is not None
        assert row["added_p50_ms"] is not None and row["added_p99_ms"] >= row["added_p50_ms"]
        assert row["upstream_requests"] >= 5 and row["prompt_tokens"] > 0
        assert 0 < row["cached_share"] < 1


def test_peers_not_installed_are_skipped_with_the_reason(result):
    assert len(result["skipped"]) == 2
    assert all("not installed" in reason for reason in result["skipped"])
    assert result["versions"] == {}


def test_every_request_is_recorded_with_its_direct_twin(result):
    for info in result["workloads"]:
        for records in info["records"].values():
            assert [r["step"] for r in records] == list(range(5))
            assert all(r["direct_seconds"] is not None for r in records)
