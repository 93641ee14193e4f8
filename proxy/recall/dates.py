"""The days a recall query asks about (pure: today is passed in), so that pages of those days can rank first.

``asked_days(text, today)`` reads, in English and Chinese:

* a calendar date: ``2023-05-02``, ``May 2nd``, ``May 2, 2023``, ``the 2nd of May``, ``5月2日`` / ``5月2号``
  (without a year: the latest such day not after ``today``);
* a day counted back from today: ``today``, ``yesterday``, ``the day before yesterday``, ``3 days ago``,
  今天, 昨天, 前天, 三天前;
* a calendar week or month: ``this week``, ``last week``, ``this month``, ``last month``, 这周, 上周, 这个月, 上个月.

Vague times ("a few days ago", "recently", 前几天) are not read: a wrong guess would rank the right page down.
The answer is an inclusive span of days (``DaySpan``), or None when the query names no time. A query naming
several times gets the span covering them all.

``prefer_days(ranking, day_of_id, span)`` lets the pages of those days climb a ranking: it is fused
(reciprocal-rank fusion, proxy.recall.fusion) with its own sub-list of pages dated in the span, so a page of the
asked day moves up as if a second ranking had also found it, and a page the search did not find stays out.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from proxy.engine.contents import utc_day as day_of  # the day a page is dated by, on the contents page too
from proxy.recall.fusion import reciprocal_rank_fusion

__all__ = ["DaySpan", "asked_days", "day_of", "prefer_days"]

Id = TypeVar("Id", bound=Hashable)

_MONTHS = {name: number for number, names in enumerate(
    (("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"), ("may",), ("jun", "june"),
     ("jul", "july"), ("aug", "august"), ("sep", "sept", "september"), ("oct", "october"), ("nov", "november"),
     ("dec", "december")), start=1) for name in names}
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>[0-3]?\d)(?P<ordinal>st|nd|rd|th)?"
_YEAR = r"(?:,?\s+(?P<year>(?:19|20)\d\d))?"
_ISO = re.compile(r"\b(?P<year>(?:19|20)\d\d)-(?P<month>[01]?\d)-(?P<day>[0-3]?\d)\b")
_MONTH_DAY = re.compile(r"\b" + _MONTH + r"\s+" + _DAY + r"\b" + _YEAR, re.IGNORECASE)
_DAY_OF_MONTH = re.compile(r"\b" + _DAY + r"\s+(?:of\s+)?" + _MONTH + r"\b" + _YEAR, re.IGNORECASE)
_ZH_DATE = re.compile(r"(?:(?P<year>(?:19|20)\d\d)年)?(?P<month>[01]?\d)月(?P<day>[0-3]?\d)[日号]")
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
                 "ten": 10, "a couple of": 2, "a": 1, "一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6,
                 "七": 7, "八": 8, "九": 9, "十": 10}
_DAYS_AGO = re.compile(r"\b(?P<n>\d{1,3}|one|two|three|four|five|six|seven|eight|nine|ten|a couple of|a)\s+days?\s+"
                       r"ago\b|(?P<zh>\d{1,3}|[一两二三四五六七八九十])天(?:以)?前", re.IGNORECASE)
_BACK = [  # (pattern, days back) of single days
    (re.compile(r"\bthe\s+day\s+before\s+yesterday\b|前天", re.IGNORECASE), 2),
    (re.compile(r"\byesterday\b|昨天", re.IGNORECASE), 1),
    (re.compile(r"\btoday\b|今天", re.IGNORECASE), 0),
]
_WEEK = re.compile(r"\b(?P<which>this|last|past)\s+week\b|(?P<zh>这周|本周|这个星期|上周|上个星期|上星期)", re.IGNORECASE)
# Every form read holds a digit or one of these: most queries are turned away by this one scan.
_MAY_NAME_A_DAY = re.compile(r"\d|today|yesterday|ago|week|month|[今昨前天周月]|星期", re.IGNORECASE)
_MONTH_SPAN = re.compile(r"\b(?P<which>this|last|past)\s+month\b|(?P<zh>这个月|本月|上个月|上月)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class DaySpan:
    """Days ``first`` to ``last``, both included."""

    first: _dt.date
    last: _dt.date

    def __contains__(self, day: object) -> bool:
        return isinstance(day, _dt.date) and self.first <= day <= self.last

    def cover(self, other: DaySpan) -> DaySpan:
        return DaySpan(min(self.first, other.first), max(self.last, other.last))


def _calendar_day(year: str | None, month: int, day: int, today: _dt.date) -> _dt.date | None:
    try:
        if year:
            return _dt.date(int(year), month, day)
        found = _dt.date(today.year, month, day)
        return found if found <= today else _dt.date(today.year - 1, month, day)
    except ValueError:  # 31 April, 29 February of a common year
        return None


def _calendar_days(text: str, today: _dt.date) -> list[_dt.date]:
    days = []
    for pattern in (_ISO, _MONTH_DAY, _DAY_OF_MONTH, _ZH_DATE):
        for match in pattern.finditer(text):
            month = match.group("month")
            if month == "may" and not (match.groupdict().get("ordinal") or match.group("year")):
                continue  # "what may 2 people do": the verb; "may 2nd", "May 2" and "may 2, 2023" are dates
            number = int(month) if month.isdigit() else _MONTHS[month.lower().rstrip(".")]
            if 1 <= number <= 12:
                found = _calendar_day(match.group("year"), number, int(match.group("day")), today)
                if found is not None:
                    days.append(found)
    return days


def _spans_back(text: str, today: _dt.date) -> list[DaySpan]:
    spans = []
    for pattern, back in _BACK:
        if pattern.search(text):
            day = today - _dt.timedelta(days=back)
            spans.append(DaySpan(day, day))
            text = pattern.sub(" ", text)  # "the day before yesterday" is not also "yesterday"
    for match in _DAYS_AGO.finditer(text):
        raw = match.group("n") or match.group("zh")
        back = int(raw) if raw.isdigit() else _NUMBER_WORDS[raw.lower()]
        day = today - _dt.timedelta(days=back)
        spans.append(DaySpan(day, day))
    return spans


def _calendar_spans(text: str, today: _dt.date) -> list[DaySpan]:
    spans = []
    for match in _WEEK.finditer(text):
        last_week = (match.group("which") or "").lower() in ("last", "past") or (match.group("zh") or "")[:1] == "上"
        monday = today - _dt.timedelta(days=today.weekday())
        if last_week:
            spans.append(DaySpan(monday - _dt.timedelta(days=7), monday - _dt.timedelta(days=1)))
        else:
            spans.append(DaySpan(monday, today))
    for match in _MONTH_SPAN.finditer(text):
        last_month = (match.group("which") or "").lower() in ("last", "past") or (match.group("zh") or "")[:1] == "上"
        first = today.replace(day=1)
        if last_month:
            end = first - _dt.timedelta(days=1)
            spans.append(DaySpan(end.replace(day=1), end))
        else:
            spans.append(DaySpan(first, today))
    return spans


def asked_days(text: str, today: _dt.date) -> DaySpan | None:
    """The days ``text`` asks about (module docstring), or None when it names no time."""
    if _MAY_NAME_A_DAY.search(text) is None:
        return None
    spans = [DaySpan(day, day) for day in _calendar_days(text, today)]
    spans += _spans_back(text, today) + _calendar_spans(text, today)
    if not spans:
        return None
    covered = spans[0]
    for span in spans[1:]:
        covered = covered.cover(span)
    return covered


def prefer_days(
    ranking: Sequence[tuple[Id, float]], day_of_id: Callable[[Id], _dt.date | None], span: DaySpan,
    keep_scores: bool = False,
) -> list[tuple[Id, float]]:
    """``ranking`` (best first) fused with its pages dated in ``span``; unchanged when none is. The scores are the
    fusion's, or with ``keep_scores`` each page's own (a BM25 score that a floor is compared with)."""
    dated = [doc_id for doc_id, _ in ranking if day_of_id(doc_id) in span]
    if not dated:
        return list(ranking)
    fused = reciprocal_rank_fusion([[doc_id for doc_id, _ in ranking], dated])
    if not keep_scores:
        return fused
    own = dict(ranking)
    return [(doc_id, own[doc_id]) for doc_id, _ in fused]
