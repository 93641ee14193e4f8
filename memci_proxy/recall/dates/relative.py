"""Times a query counts back from today (pure: today is passed in), as inclusive (first, last) day pairs.

Read, in English and Chinese (memci_proxy.recall.dates.asked combines them with calendar dates):

* a day: ``today``, ``yesterday``, ``the day before yesterday``, ``3 days ago``, 今天, 昨天, 前天, 三天前;
* a time some weeks, months or years back: ``two weeks ago``, ``a month ago``, ``a year ago``, 两周前, 三个月前. Such
  a count is rounded by whoever says it, so it stands for the days that round to it: half a unit either side
  ("two weeks ago": 10 to 18 days back; "a month ago": 15 to 46);
* a time up to today: ``the past week``, ``in the last month``, ``the past 3 days``, ``the last two months``,
  ``this week``, ``this month``, ``this year``, 过去三天, 最近两周, 这周, 这个月, 今年 (``the past month``: from the
  same day a month ago to today);
* a calendar week, month or year before this one: ``last week``, ``last month``, ``last year``, 上周, 上个月, 去年;
* a named day or weekend: ``last Saturday``, ``this past Monday`` (the latest such day before today), ``last
  weekend``, ``this past weekend`` (the latest Saturday and Sunday before today), 上周六, 上周末.

Vague times ("a few days ago", "recently", "on Fridays", 前几天) are not read: a wrong guess would rank the right
page down. Each phrase is read once ("the day before yesterday" is not also "yesterday", "the past two weeks" not
also "last week").
"""

from __future__ import annotations

import calendar
import datetime as _dt
import re

__all__ = ["relative_spans", "without_relative_times", "MAY_NAME_A_TIME"]

Span = tuple[_dt.date, _dt.date]

_EN_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
               "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a": 1, "an": 1}
_ZH_NUMBERS = {"一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
_EN_NUMBER = r"(?P<n>\d{1,3}|" + "|".join(sorted(_EN_NUMBERS, key=len, reverse=True)) + ")"
_ZH_NUMBER = r"(?P<zh>\d{1,3}|[一两二三四五六七八九十])"
_ZH_UNITS = {"天": "day", "日": "day", "周": "week", "个星期": "week", "星期": "week", "个礼拜": "week",
             "礼拜": "week", "个月": "month", "年": "year"}
_ZH_UNIT = "(?P<zhunit>" + "|".join(sorted(_ZH_UNITS, key=len, reverse=True)) + ")"
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_ZH_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}

_SINGLE_DAYS = [  # (pattern, days back)
    (re.compile(r"\bthe\s+day\s+before\s+yesterday\b|前天", re.IGNORECASE), 2),
    (re.compile(r"\byesterday\b|昨天", re.IGNORECASE), 1),
    (re.compile(r"\btoday\b|今天", re.IGNORECASE), 0),
]
_AGO = re.compile(r"\b" + _EN_NUMBER + r"\s+(?P<unit>day|week|month|year)s?\s+ago\b|"
                  + _ZH_NUMBER + _ZH_UNIT + r"(?:以)?前", re.IGNORECASE)
# "the past 3 days", "in the last two months", "past week", "the last month" (a time up to today; "last month"
# alone is the calendar month, below; "the last day" is mostly the last one of something, not read)
_UP_TO_TODAY = re.compile(
    r"\b(?:(?:the\s+)?(?:past|last)\s+" + _EN_NUMBER + r"\s+(?P<units>day|week|month|year)s\b"
    r"|(?:(?:in|over|during|within|for)\s+)?the\s+(?:past|last)\s+(?P<unit>week|month|year)\b"
    r"|past\s+(?P<bare>week|month|year)\b)"
    r"|(?:过去|最近|近)" + _ZH_NUMBER + _ZH_UNIT, re.IGNORECASE)
_NAMED_DAY = re.compile(r"\b(?:last|this\s+past)\s+(?P<weekday>" + "|".join(_WEEKDAYS) + r")\b"
                        r"|上(?:个)?(?:周|星期|礼拜)(?P<zhday>[一二三四五六日天])", re.IGNORECASE)
_WEEKEND = re.compile(r"\b(?:last|this\s+past|the\s+past|past)\s+weekend\b|(?P<zh>上(?:个)?周末)", re.IGNORECASE)
_CALENDAR = re.compile(r"\b(?P<which>this|last)\s+(?P<unit>week|month|year)\b"
                       r"|(?P<zh>这周|本周|这个星期|上周|上个星期|上星期|这个月|本月|上个月|上月|今年|去年)", re.IGNORECASE)
_ZH_CALENDAR = {"这周": ("this", "week"), "本周": ("this", "week"), "这个星期": ("this", "week"),
                "上周": ("last", "week"), "上个星期": ("last", "week"), "上星期": ("last", "week"),
                "这个月": ("this", "month"), "本月": ("this", "month"), "上个月": ("last", "month"),
                "上月": ("last", "month"), "今年": ("this", "year"), "去年": ("last", "year")}
# Vague times, not read (module docstring) but times all the same: "a few weeks ago", "several months ago", 前几天
_VAGUE = re.compile(r"\b(?:a\s+few|several|some|many)\s+(?:day|week|month|year)s?\s+ago\b|(?:前|这)几(?:天|周|个星期|个月|年)"
                    r"|几(?:天|周|个星期|个月|年)(?:以)?前", re.IGNORECASE)
# Every form read holds a digit or one of these: most queries are turned away by this one scan.
MAY_NAME_A_TIME = re.compile(r"\d|day|ago|week|month|year|[今昨前天周月年]|星期|礼拜", re.IGNORECASE)


def _months_back(today: _dt.date, months: int) -> _dt.date:
    year, month = divmod(today.year * 12 + today.month - 1 - months, 12)
    return _dt.date(year, month + 1, min(today.day, calendar.monthrange(year, month + 1)[1]))


def _back(today: _dt.date, count: float, unit: str) -> _dt.date:
    """The day ``count`` units before ``today`` (a half month: 15 days)."""
    if unit == "month" and count == int(count):
        return _months_back(today, int(count))
    days = {"day": 1, "week": 7, "month": 30.4, "year": 365.25}[unit]
    return today - _dt.timedelta(days=round(count * days))


def _count(match: re.Match[str]) -> int:
    raw = match.group("n") or match.group("zh")
    return int(raw) if raw.isdigit() else (_EN_NUMBERS.get(raw.lower()) or _ZH_NUMBERS[raw])


def _unit(match: re.Match[str], *names: str) -> str:
    for name in names:
        if match.group(name):
            return match.group(name).lower()
    return _ZH_UNITS[match.group("zhunit")]


def _ago(match: re.Match[str], today: _dt.date) -> Span:
    count, unit = _count(match), _unit(match, "unit")
    if unit == "day":
        day = _back(today, count, unit)
        return day, day
    return _back(today, count + 0.5, unit), min(today, _back(today, count - 0.5, unit))


def _up_to_today(match: re.Match[str], today: _dt.date) -> Span:
    count = _count(match) if match.group("n") or match.group("zh") else 1
    return _back(today, count, _unit(match, "units", "unit", "bare")), today


def _named_day(match: re.Match[str], today: _dt.date) -> Span:
    if match.group("weekday"):
        back = (today.weekday() - _WEEKDAYS.index(match.group("weekday").lower()) - 1) % 7 + 1
        day = today - _dt.timedelta(days=back)
    else:
        monday = today - _dt.timedelta(days=today.weekday() + 7)
        day = monday + _dt.timedelta(days=_ZH_WEEKDAYS[match.group("zhday")])
    return day, day


def _weekend(match: re.Match[str], today: _dt.date) -> Span:
    if match.group("zh"):
        sunday = today - _dt.timedelta(days=today.weekday() + 1)  # the Sunday ending last calendar week
    else:
        sunday = today - _dt.timedelta(days=(today.weekday() + 1) % 7 or 7)  # the latest Sunday before today
    return sunday - _dt.timedelta(days=1), sunday


def _calendar(match: re.Match[str], today: _dt.date) -> Span:
    which, unit = ((match.group("which") or "").lower(), (match.group("unit") or "").lower())
    if match.group("zh"):
        which, unit = _ZH_CALENDAR[match.group("zh")]
    if unit == "week":
        first = today - _dt.timedelta(days=today.weekday())
    elif unit == "month":
        first = today.replace(day=1)
    else:
        first = today.replace(month=1, day=1)
    if which == "this":
        return first, today
    last = first - _dt.timedelta(days=1)
    if unit == "week":
        return last - _dt.timedelta(days=6), last
    return (last.replace(day=1) if unit == "month" else last.replace(month=1, day=1)), last


_READERS = [(_AGO, _ago), (_UP_TO_TODAY, _up_to_today), (_NAMED_DAY, _named_day), (_WEEKEND, _weekend),
            (_CALENDAR, _calendar)]


def relative_spans(text: str, today: _dt.date) -> list[Span]:
    """The (first, last) days of each time ``text`` counts back from ``today`` (module docstring)."""
    spans: list[Span] = []
    for pattern, back in _SINGLE_DAYS:
        if pattern.search(text):
            day = today - _dt.timedelta(days=back)
            spans.append((day, day))
            text = pattern.sub(" ", text)
    for pattern, read in _READERS:
        for match in pattern.finditer(text):
            spans.append(read(match, today))
        text = pattern.sub(" ", text)
    return spans


def without_relative_times(text: str) -> str:
    """``text`` with each time it counts back from today blanked out, vague ones ("a few days ago") too."""
    for pattern, _ in _SINGLE_DAYS:
        text = pattern.sub(" ", text)
    for pattern, _ in _READERS:
        text = pattern.sub(" ", text)
    return _VAGUE.sub(" ", text)
