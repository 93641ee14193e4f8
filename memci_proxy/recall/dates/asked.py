"""The days a recall query asks about (pure: today is passed in), so that pages of those days can rank first.

``asked_days(text, today)`` reads, in English and Chinese:

* a calendar date: ``2023-05-02``, ``May 2nd``, ``May 2, 2023``, ``the 2nd of May``, ``5月2日`` / ``5月2号``
  (without a year: the latest such day not after ``today``);
* a time counted back from today (memci_proxy.recall.dates.relative): ``yesterday``, ``3 days ago``, ``two weeks ago``,
  ``the past month``, ``last week``, ``last Saturday``, ``last weekend``, ``this year``, 昨天, 三天前, 上个月, 上周六.

Vague times ("a few days ago", "recently", 前几天) are not read: a wrong guess would rank the right page down.
The answer is an inclusive span of days (``DaySpan``), or None when the query names no time. A query naming
several times gets the span covering them all.

``prefer_days(ranking, day_of_id, span)`` lets the pages of those days climb a ranking: it is fused
(reciprocal-rank fusion, memci_proxy.recall.search.fusion) with its own sub-list of pages dated in the span (then, with
``until``, of those dated after it up to that day), so a page of the asked day moves up as if a second ranking had
also found it, and a page the search did not find stays out.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from memci_proxy.engine.contents import utc_day as day_of  # the day a page is dated by, on the contents page too
from memci_proxy.recall.search.fusion import reciprocal_rank_fusion
from memci_proxy.recall.dates.relative import MAY_NAME_A_TIME, relative_spans, without_relative_times

__all__ = ["DaySpan", "asked_days", "day_of", "prefer_days", "without_times"]

Id = TypeVar("Id", bound=Hashable)

AFTER_WEIGHT = 0.75

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
            if _the_verb_may(match):
                continue
            number = int(month) if month.isdigit() else _MONTHS[month.lower().rstrip(".")]
            if 1 <= number <= 12:
                found = _calendar_day(match.group("year"), number, int(match.group("day")), today)
                if found is not None:
                    days.append(found)
    return days


def asked_days(text: str, today: _dt.date) -> DaySpan | None:
    """The days ``text`` asks about (module docstring), or None when it names no time."""
    if MAY_NAME_A_TIME.search(text) is None:
        return None
    spans = [DaySpan(day, day) for day in _calendar_days(text, today)]
    spans += [DaySpan(first, last) for first, last in relative_spans(text, today)]
    if not spans:
        return None
    covered = spans[0]
    for span in spans[1:]:
        covered = covered.cover(span)
    return covered


def without_times(text: str) -> str:
    """``text`` with the times it names blanked out (calendar dates, times counted back from today, vague ones
    such as "a few weeks ago"): what it asks about, not when. Unchanged when it names no time."""
    if MAY_NAME_A_TIME.search(text) is None:
        return text
    for pattern in (_ISO, _MONTH_DAY, _DAY_OF_MONTH, _ZH_DATE):
        text = pattern.sub(_blank_date, text)
    return without_relative_times(text)


def _blank_date(match: re.Match[str]) -> str:
    """A calendar date blanked out, as _calendar_days reads them ("what may 2 people do" is left alone)."""
    return match.group() if _the_verb_may(match) else " "


def _the_verb_may(match: re.Match[str]) -> bool:
    """"what may 2 people do": the verb; "may 2nd", "May 2" and "may 2, 2023" are dates."""
    return match.group("month") == "may" and not (match.groupdict().get("ordinal") or match.group("year"))


def prefer_days(
    ranking: Sequence[tuple[Id, float]], day_of_id: Callable[[Id], _dt.date | None], span: DaySpan,
    keep_scores: bool = False, until: _dt.date | None = None,
) -> list[tuple[Id, float]]:
    """``ranking`` (best first) fused with its pages dated in ``span`` and, more weakly (``AFTER_WEIGHT``), with
    those dated after it up to ``until`` (an event is told of on its day or later); unchanged when none is. The
    scores are the fusion's, or with ``keep_scores`` each page's own (a BM25 score that a floor is compared with)."""
    ids = [doc_id for doc_id, _ in ranking]
    rankings, weights = [ids], [1.0]
    dated = [doc_id for doc_id in ids if day_of_id(doc_id) in span]
    if dated:
        rankings.append(dated)
        weights.append(1.0)
    if until is not None and until > span.last:
        after = DaySpan(span.last + _dt.timedelta(days=1), until)
        later = [doc_id for doc_id in ids if day_of_id(doc_id) in after]
        if later:
            rankings.append(later)
            weights.append(AFTER_WEIGHT)
    if len(rankings) == 1:
        return list(ranking)
    fused = reciprocal_rank_fusion(rankings, weights=weights)
    if not keep_scores:
        return fused
    own = dict(ranking)
    return [(doc_id, own[doc_id]) for doc_id, _ in fused]
