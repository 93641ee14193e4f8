"""Archival by age on a synthetic three-month history (clock injected): day and month summary rows, the
tri-state archive flag, month summaries hiding their days, limits that never drop an unarchived message."""

from __future__ import annotations

import datetime as dt

from memci_proxy.store.sql.repository import SqlConversationRepository
from memci_proxy.workers.archival import OVERFLOW_EVENT
from memci_proxy.workers.backoff import BACKLOG_EVENT
from memci_proxy.workers.config import MemoryConfig
from memci_proxy.workers.queue import ARCHIVE_JOB, InProcessJobQueue, Job
from memci_proxy.workers.runner import MemoryWorker
from memci_proxy.workers.summarizer import SummaryFailed
from tests.integration.workers.conftest import TENANT, History

NOW = dt.datetime(2026, 3, 20, 12, 0, tzinfo=dt.timezone.utc)
START = dt.date(2026, 1, 10)
DAYS = [START + dt.timedelta(days=i) for i in range((NOW.date() - START).days + 1)]  # 10 Jan .. 20 Mar


class FakeSummarizer:
    """Answers 'summary of <period>'; fails for the periods in ``failing``; checks flags while it works."""

    def __init__(self, repo: SqlConversationRepository | None = None, conversation_id: str = "") -> None:
        self.calls: list[str] = []
        self.failing: set[str] = set()
        self.repo, self.conversation_id = repo, conversation_id
        self.flags_seen: dict[str, set[str]] = {}

    async def complete(self, instruction: str, text: str, max_tokens: int) -> str:
        period = instruction.split("(")[1].split(")")[0]
        self.calls.append(period)
        if self.repo is not None and len(period) == 10:
            flags = await self.repo.archive_flags(TENANT, self.conversation_id)
            self.flags_seen[period] = {flags[s] for s in flags if s in self._seqs_of(period)}
        if period in self.failing:
            raise SummaryFailed("summariser answered HTTP 500")
        return f"summary of {period}"

    def _seqs_of(self, day: str) -> set[int]:
        index = DAYS.index(dt.date.fromisoformat(day))
        return {2 * index, 2 * index + 1}


async def three_months(repo: SqlConversationRepository, conversation_id: str = "h") -> History:
    """Two messages a day from 10 January to 20 March, stored at noon of their day."""
    history = await History(repo, conversation_id).create()
    await history.add_pages([(f"question of {d}", f"answer of {d}") for d in DAYS])
    stamps = {}
    for i, day in enumerate(DAYS):
        when = dt.datetime.combine(day, dt.time(12), dt.timezone.utc)
        stamps[2 * i], stamps[2 * i + 1] = when, when
    await history.date_entries(stamps)
    return history


def worker_for(repo: SqlConversationRepository, summarizer: FakeSummarizer, **config: int) -> MemoryWorker:
    return MemoryWorker(repo, summarizer, InProcessJobQueue(), MemoryConfig(**config), clock=lambda: NOW)


async def test_days_and_months_by_age(repo: SqlConversationRepository) -> None:
    await three_months(repo)
    summarizer = FakeSummarizer(repo, "h")
    report = await worker_for(repo, summarizer).handle(Job(ARCHIVE_JOB, TENANT, "h"))

    january = [d.isoformat() for d in DAYS if d.month == 1]
    daily = [d.isoformat() for d in DAYS if d.month == 2 or (d.month == 3 and d.day <= 14)]
    verbatim = [d.isoformat() for d in DAYS if d.month == 3 and d.day >= 15]  # the last five days and today
    assert report.months == ["2026-01"]
    assert sorted(report.days) == sorted(january + daily)
    assert report.failed == [] and report.pruned == 0

    rows = {(r.kind, r.period): r for r in await repo.list_summaries(TENANT, "h")}
    assert set(rows) == {("month", "2026-01")} | {("day", d) for d in january + daily}
    assert all(r.status == "done" for r in rows.values())
    assert rows[("month", "2026-01")].message_count == 2 * len(january)
    february_first = rows[("day", "2026-02-01")]
    assert february_first.text == "summary of 2026-02-01" and february_first.message_count == 2

    # The month hides its days from retrieval; February and March days stay retrievable.
    retrievable = {(r.kind, r.period) for r in await repo.list_summaries(TENANT, "h", retrievable=True)}
    assert retrievable == {("month", "2026-01")} | {("day", d) for d in daily}

    flags = await repo.archive_flags(TENANT, "h")
    verbatim_seqs = {2 * DAYS.index(dt.date.fromisoformat(d)) + k for d in verbatim for k in (0, 1)}
    assert {s for s, f in flags.items() if f == "false"} == verbatim_seqs
    assert {f for s, f in flags.items() if s not in verbatim_seqs} == {"true"}
    # While a day was being summarised its messages were pending, never unarchived nor done.
    assert summarizer.flags_seen["2026-02-10"] == {"pending"}

    # A second sweep the same day does nothing; five days later the days of 15-19 March follow, and on
    # 1 April February becomes a month.
    calls = len(summarizer.calls)
    again = await worker_for(repo, summarizer).handle(Job(ARCHIVE_JOB, TENANT, "h"))
    assert again.days == [] and again.months == [] and len(summarizer.calls) == calls
    later = await worker_for(repo, summarizer).handle(Job(ARCHIVE_JOB, TENANT, "h"), NOW + dt.timedelta(days=5))
    assert later.days == ["2026-03-15", "2026-03-16", "2026-03-17", "2026-03-18", "2026-03-19", "2026-03-20"][:5]
    april = await worker_for(repo, summarizer).handle(Job(ARCHIVE_JOB, TENANT, "h"), NOW + dt.timedelta(days=12))
    assert april.months == ["2026-02"]


async def test_a_failed_day_stays_pending_and_backs_off(repo: SqlConversationRepository) -> None:
    await three_months(repo)
    summarizer = FakeSummarizer()
    summarizer.failing = {"2026-01-15", "2026-02-03"}
    worker = worker_for(repo, summarizer)
    report = await worker.handle(Job(ARCHIVE_JOB, TENANT, "h"))
    assert sorted(report.failed) == ["2026-01-15", "2026-02-03"]
    assert report.months == []  # January waits for its missing day

    row = await repo.get_summary(TENANT, "h", "day", "2026-02-03")
    assert row.status == "pending" and row.attempts == 1 and row.next_attempt_at == NOW + dt.timedelta(minutes=10)
    flags = await repo.archive_flags(TENANT, "h")
    index = DAYS.index(dt.date(2026, 2, 3))
    assert flags[2 * index] == flags[2 * index + 1] == "pending"

    summarizer.failing = set()
    assert await worker.run_due(NOW + dt.timedelta(minutes=5)) == 0
    assert await worker.run_due(NOW + dt.timedelta(minutes=10)) == 1  # one archive job for the conversation
    rows = {(r.kind, r.period): r for r in await repo.list_summaries(TENANT, "h")}
    assert rows[("day", "2026-02-03")].status == "done" and rows[("day", "2026-02-03")].attempts == 0
    assert rows[("month", "2026-01")].status == "done"
    assert await repo.load_events(TENANT, "h", kinds=(BACKLOG_EVENT,)) == []


async def test_limits_prune_only_archived_messages(repo: SqlConversationRepository) -> None:
    await three_months(repo)  # 140 messages, 12 of them in the verbatim days
    summarizer = FakeSummarizer()
    summarizer.failing = {"2026-02-03"}  # its messages stay pending
    report = await worker_for(repo, summarizer, history_soft_limit=40, history_hard_limit=60).handle(
        Job(ARCHIVE_JOB, TENANT, "h")
    )
    assert report.pruned == 100 and report.stored == 40 and not report.overflow
    flags = await repo.archive_flags(TENANT, "h")
    assert len(flags) == 40
    assert sum(f == "false" for f in flags.values()) == 12  # every unarchived message is still there
    assert sum(f == "pending" for f in flags.values()) == 2  # and the pending ones
    assert min(s for s, f in flags.items() if f == "true") == 102  # the oldest archived went first
    index = DAYS.index(dt.date(2026, 2, 3))
    assert {2 * index, 2 * index + 1} <= set(flags)
    # The summaries of pruned messages remain.
    assert ("month", "2026-01") in {(r.kind, r.period) for r in await repo.list_summaries(TENANT, "h")}


async def test_unarchived_messages_over_the_hard_limit_are_kept(repo: SqlConversationRepository) -> None:
    history = await History(repo, "r").create()
    await history.add_pages([(f"q{i}", f"a{i}") for i in range(15)])  # 30 messages
    today = dt.datetime.combine(NOW.date(), dt.time(9), dt.timezone.utc)
    await history.date_entries({s: today - dt.timedelta(days=1 if s < 10 else 0) for s in range(30)})
    summarizer = FakeSummarizer()
    report = await worker_for(repo, summarizer, history_soft_limit=5, history_hard_limit=8).handle(
        Job(ARCHIVE_JOB, TENANT, "r")
    )
    # Yesterday is within the verbatim days, but the hard limit forces its archival; today's 20 stay.
    assert report.overflow and report.days == [(NOW.date() - dt.timedelta(days=1)).isoformat()]
    assert report.pruned == 10 and report.stored == 20
    assert set((await repo.archive_flags(TENANT, "r")).values()) == {"false"}
    events = await repo.load_events(TENANT, "r", kinds=(OVERFLOW_EVENT,))
    assert events[0].payload == {"stored": 30, "soft_limit": 5, "hard_limit": 8}


async def test_sweep_all_and_active_pages_are_never_pruned(repo: SqlConversationRepository) -> None:
    history = await three_months(repo)
    await history.set_state([p.number for p in history.pages[:20]], "active")  # an odd, long active chapter
    worker = worker_for(repo, FakeSummarizer(), history_soft_limit=10)
    assert await worker.sweep_all() == 1
    flags = await repo.archive_flags(TENANT, "h")
    assert set(range(40)) <= set(flags)  # the active pages' messages stayed though archived by age
