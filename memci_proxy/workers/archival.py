"""Archival by age over the stored messages (seed 001), a periodic job per conversation.

By the UTC day a message was stored, at the injected ``now``:
- the last ``verbatim_days`` days: kept verbatim (nothing to do);
- older days of this month and of last month: one summary per day (``memory_summaries`` kind ``day``);
- months before last month: one summary per month from its day summaries (kind ``month``); a month summary
  hides its days from retrieval (``list_summaries(retrievable=True)``).
Example (seed 001): on 31 January, December is summarised per day and November and before per month; on 1
February, December and before per month.

A summary row is written ``pending`` before the model is called (its messages' archive flag: pending), and
``done`` after (flag: true). Limits (counts of stored messages): over the soft limit the oldest messages whose
flag is true, outside active pages, are pruned; over the hard limit after that, a ``history_overflow`` event,
and the verbatim days but today are archived at once (forced); unarchived messages are never pruned.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from memci_proxy.workers.config import MemoryConfig
from memci_proxy.workers.summaries import backing_off, record_failure
from memci_proxy.workers.summarizer import DAY_PROMPT, MONTH_PROMPT, Summarizer, SummaryFailed
from memci_proxy.workers.text import cut_to_tokens, estimate_tokens, messages_text

OVERFLOW_EVENT = "history_overflow"
DAY_SUMMARY_TOKENS = 300
MONTH_SUMMARY_TOKENS = 500


def _month_index(day: dt.date) -> int:
    return day.year * 12 + day.month - 1


@dataclass
class AgePlan:
    daily: list[str] = field(default_factory=list)  # days (YYYY-MM-DD) to summarise per day
    monthly: dict[str, list[str]] = field(default_factory=dict)  # month (YYYY-MM) -> its days
    verbatim: list[str] = field(default_factory=list)


def plan_by_age(days: list[str], today: dt.date, verbatim_days: int, force: bool = False) -> AgePlan:
    """Which days are kept verbatim, summarised per day, or summarised per month. ``force``: the verbatim
    days but today are summarised per day too (the hard limit was hit)."""
    plan = AgePlan()
    for day in sorted(days):
        date = dt.date.fromisoformat(day)
        if _month_index(today) - _month_index(date) >= 2:
            plan.monthly.setdefault(day[:7], []).append(day)
        elif (today - date).days > verbatim_days or (force and date < today):
            plan.daily.append(day)
        else:
            plan.verbatim.append(day)
    return plan


@dataclass
class SweepReport:
    days: list[str] = field(default_factory=list)  # day summaries made
    months: list[str] = field(default_factory=list)  # month summaries made
    failed: list[str] = field(default_factory=list)  # periods whose summary failed
    waiting: list[str] = field(default_factory=list)  # periods backing off
    pruned: int = 0
    overflow: bool = False
    stored: int = 0  # messages stored after the sweep


class ArchiveSweep:
    def __init__(self, repo: Any, summarizer: Summarizer, config: MemoryConfig) -> None:
        self.repo, self.summarizer, self.config = repo, summarizer, config

    async def run(self, tenant: str, conversation_id: str, now: dt.datetime) -> SweepReport:
        report = SweepReport()
        await self._archive(tenant, conversation_id, now, False, report)
        soft, hard = self.config.history_soft_limit, self.config.history_hard_limit
        stored = await self.repo.count_entries(tenant, conversation_id)
        if soft and stored > soft:
            pruned = await self.repo.prune_archived_entries(tenant, conversation_id, stored - soft)
            report.pruned += pruned
            stored -= pruned
        if hard and stored > hard:
            report.overflow = True
            await self.repo.add_event(tenant, conversation_id, OVERFLOW_EVENT,
                                      {"stored": stored, "soft_limit": soft, "hard_limit": hard})
            await self._archive(tenant, conversation_id, now, True, report)
            pruned = await self.repo.prune_archived_entries(tenant, conversation_id, stored - (soft or hard))
            report.pruned += pruned
            stored -= pruned
        report.stored = stored
        return report

    async def _archive(self, tenant: str, conversation_id: str, now: dt.datetime, force: bool,
                       report: SweepReport) -> None:
        stats = {d.day: d for d in await self.repo.entry_days(tenant, conversation_id)}
        plan = plan_by_age(list(stats), now.astimezone(dt.timezone.utc).date(), self.config.verbatim_days, force)
        rows = {(r.kind, r.period): r for r in await self.repo.list_summaries(tenant, conversation_id)}
        for day in [*plan.daily, *(d for days in plan.monthly.values() for d in days)]:
            if rows.get(("month", day[:7])) is not None and rows[("month", day[:7])].status == "done":
                continue  # the month is summarised: its days need nothing more
            await self._summarise_day(tenant, conversation_id, stats[day], rows.get(("day", day)), now, report)
        if plan.monthly:
            rows = {(r.kind, r.period): r for r in await self.repo.list_summaries(tenant, conversation_id)}
        for month, days in plan.monthly.items():
            await self._summarise_month(tenant, conversation_id, month, [stats[d] for d in days], rows, now, report)

    async def _summarise_day(self, tenant: str, conversation_id: str, day: Any, row: Any, now: dt.datetime,
                             report: SweepReport) -> None:
        if row is not None and row.status == "done" and row.last_seq >= day.last_seq and row.message_count >= day.count:
            return
        if backing_off(row, now):
            report.waiting.append(day.day)
            return
        await self.repo.mark_pending(tenant, conversation_id, "day", day.day, day.first_seq, day.last_seq, day.count)
        entries = await self.repo.load_entries_of_days(tenant, conversation_id, [day.day])
        text = messages_text((m for _, m in entries), self.config.message_chars)
        try:
            summary = await self.summarizer.complete(
                DAY_PROMPT.format(period=day.day), text[: 2 * self.config.batch_chars],
                DAY_SUMMARY_TOKENS,
            )
        except SummaryFailed as exc:
            await record_failure(self.repo, tenant, conversation_id, "day", day.day, row.attempts if row else 0,
                                 now, str(exc))
            report.failed.append(day.day)
            return
        summary = cut_to_tokens(summary, DAY_SUMMARY_TOKENS)
        await self.repo.put_summary(tenant, conversation_id, "day", day.day, summary, estimate_tokens(summary),
                                    day.first_seq, day.last_seq, day.count)
        report.days.append(day.day)

    async def _summarise_month(self, tenant: str, conversation_id: str, month: str, days: list[Any],
                               rows: dict[tuple[str, str], Any], now: dt.datetime, report: SweepReport) -> None:
        row = rows.get(("month", month))
        count = sum(d.count for d in days)
        if row is not None and row.status == "done" and row.message_count >= count:
            return
        if backing_off(row, now):
            report.waiting.append(month)
            return
        day_rows = [rows.get(("day", d.day)) for d in days]
        if any(r is None or r.status != "done" for r in day_rows):
            return  # a day summary is still missing (failed or backing off): the month waits for it
        first, last = min(d.first_seq for d in days), max(d.last_seq for d in days)
        await self.repo.mark_pending(tenant, conversation_id, "month", month, first, last, count)
        text = "\n\n".join(f"[{r.period}] {r.text}" for r in day_rows)
        try:
            summary = await self.summarizer.complete(MONTH_PROMPT.format(period=month), text, MONTH_SUMMARY_TOKENS)
        except SummaryFailed as exc:
            await record_failure(self.repo, tenant, conversation_id, "month", month, row.attempts if row else 0,
                                 now, str(exc))
            report.failed.append(month)
            return
        summary = cut_to_tokens(summary, MONTH_SUMMARY_TOKENS)
        await self.repo.put_summary(tenant, conversation_id, "month", month, summary, estimate_tokens(summary),
                                    first, last, count)
        report.months.append(month)
