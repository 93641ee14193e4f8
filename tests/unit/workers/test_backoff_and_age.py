"""Pure parts of the memory workers: the back-off schedule, the age plan, text helpers, summary merging."""

from __future__ import annotations

import datetime as dt

import pytest

from memci_proxy.workers.archival import plan_by_age
from memci_proxy.workers.backoff import MAX_ATTEMPTS, after_failure
from memci_proxy.workers.summaries import merge_summaries
from memci_proxy.workers.summarizer import SummaryFailed
from memci_proxy.workers.text import batches, cut_to_tokens, estimate_tokens, fact_digest, parse_facts

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def test_backoff_schedule() -> None:
    steps, attempts, backlog = [], 0, []
    for _ in range(7):
        retry = after_failure(attempts, T0)
        steps.append(retry.next_attempt_at - T0)
        backlog.append(retry.backlog)
        attempts = retry.attempts
    minutes = [int(s.total_seconds() // 60) for s in steps]
    assert minutes == [10, 30, 120, 360, 720, 720, 720]
    assert backlog == [False, False, False, False, True, False, False]
    assert MAX_ATTEMPTS == 5


def _days(first: str, last: str) -> list[str]:
    a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    return [(a + dt.timedelta(days=i)).isoformat() for i in range((b - a).days + 1)]


def test_age_plan_follows_the_seed_example() -> None:
    days = _days("2025-10-20", "2026-02-01")
    on_31_january = plan_by_age(days, dt.date(2026, 1, 31), 5)
    assert set(on_31_january.monthly) == {"2025-10", "2025-11"}
    assert on_31_january.daily[0] == "2025-12-01" and on_31_january.daily[-1] == "2026-01-25"
    assert on_31_january.verbatim[0] == "2026-01-26"

    on_1_february = plan_by_age(days, dt.date(2026, 2, 1), 5)
    assert set(on_1_february.monthly) == {"2025-10", "2025-11", "2025-12"}
    assert on_1_february.daily[0] == "2026-01-01" and on_1_february.daily[-1] == "2026-01-26"
    assert on_1_february.monthly["2025-12"] == _days("2025-12-01", "2025-12-31")


def test_forced_age_plan_keeps_only_today_verbatim() -> None:
    days = _days("2026-01-27", "2026-01-31")
    plan = plan_by_age(days, dt.date(2026, 1, 31), 5, force=True)
    assert plan.verbatim == ["2026-01-31"] and plan.daily == _days("2026-01-27", "2026-01-30")


def test_text_helpers() -> None:
    assert parse_facts("- Name is Ada\n* prefers tea\nprose line\n- NONE") == ["Name is Ada", "prefers tea"]
    assert parse_facts("NONE") == []
    assert fact_digest("Name  is ADA") == fact_digest("name is ada")
    assert [len(b) for b in batches([(i, "x" * 40) for i in range(5)], 100)] == [2, 2, 1]
    assert [len(b) for b in batches([(0, "x" * 300), (1, "y")], 100)] == [1, 1]
    cut = cut_to_tokens("word " * 200, 20)
    assert estimate_tokens(cut) <= 20 and cut.endswith("…")


class Compressor:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[int] = []
        self.fail = fail

    async def complete(self, instruction: str, text: str, max_tokens: int) -> str:
        self.calls.append(max_tokens)
        if self.fail:
            raise SummaryFailed("down")
        return "c" * (4 * max_tokens)  # exactly max_tokens by the estimate


async def test_merge_without_compression_when_it_fits() -> None:
    c = Compressor()
    assert await merge_summaries(c, "old", "new", 100) == ("old\n\nnew", 0)
    assert c.calls == []


async def test_merge_compresses_the_old_summary_to_a_third() -> None:
    c = Compressor()
    old, new = "o" * 320, "n" * 80  # 80 and 20 tokens, budget 90
    merged, compressions = await merge_summaries(c, old, new, 90)
    assert compressions == 1 and c.calls == [80 // 3]
    assert merged.endswith(new) and estimate_tokens(merged) <= 90


async def test_merge_compresses_the_whole_when_still_over() -> None:
    c = Compressor()
    merged, compressions = await merge_summaries(c, "o" * 320, "n" * 400, 90)
    assert compressions == 2 and c.calls == [26, 90] and estimate_tokens(merged) <= 90


async def test_merge_failure_propagates() -> None:
    with pytest.raises(SummaryFailed):
        await merge_summaries(Compressor(fail=True), "o" * 400, "n" * 400, 50)
