"""The days a recall query names, and the search that lets the pages of those days climb."""

from __future__ import annotations

import datetime as dt

import pytest

from memci_proxy.engine import EstimateCounter
from memci_proxy.engine.state import ARCHIVED, ConversationState, PageRecord
from memci_proxy.recall.dates.asked import DaySpan, asked_days, day_of, prefer_days, without_times
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.tool.schema import RecallArgs

TODAY = dt.date(2023, 5, 6)  # a Saturday
D = dt.date


NAMED_DAYS = [
    ("On May 2nd, I went to the museum", D(2023, 5, 2), D(2023, 5, 2)),
    ("what did I say on April 27th?", D(2023, 4, 27), D(2023, 4, 27)),
    ("the 3rd of Dec. please", D(2022, 12, 3), D(2022, 12, 3)),  # no year: the latest one before today
    ("Sept 9, 2021 meeting", D(2021, 9, 9), D(2021, 9, 9)),
    ("log of 2023-04-30", D(2023, 4, 30), D(2023, 4, 30)),
    ("我5月2号说了什么", D(2023, 5, 2), D(2023, 5, 2)),
    ("what did we decide yesterday", D(2023, 5, 5), D(2023, 5, 5)),
    ("the day before yesterday", D(2023, 5, 4), D(2023, 5, 4)),
    ("three days ago I told you", D(2023, 5, 3), D(2023, 5, 3)),
    ("我前天说的", D(2023, 5, 4), D(2023, 5, 4)),
    ("last week's plan", D(2023, 4, 24), D(2023, 4, 30)),
    ("this week", D(2023, 5, 1), D(2023, 5, 6)),
    ("last month", D(2023, 4, 1), D(2023, 4, 30)),
    ("上个月", D(2023, 4, 1), D(2023, 4, 30)),
    ("on May 2nd and yesterday", D(2023, 5, 2), D(2023, 5, 5)),  # several: the span covering them
    # counted back in weeks, months, years: the days that round to the count (half a unit either side)
    ("two weeks ago", D(2023, 4, 18), D(2023, 4, 26)),
    ("a couple of weeks ago", D(2023, 4, 18), D(2023, 4, 26)),
    ("a month ago", D(2023, 3, 21), D(2023, 4, 21)),
    ("3 months ago", D(2023, 1, 20), D(2023, 2, 19)),
    ("a year ago", D(2021, 11, 4), D(2022, 11, 4)),
    ("两周前", D(2023, 4, 18), D(2023, 4, 26)),
    # a time up to today
    ("in the past month", D(2023, 4, 6), D(2023, 5, 6)),
    ("in the last month", D(2023, 4, 6), D(2023, 5, 6)),
    ("the past week", D(2023, 4, 29), D(2023, 5, 6)),
    ("over the past 3 days", D(2023, 5, 3), D(2023, 5, 6)),
    ("in the last two weeks", D(2023, 4, 22), D(2023, 5, 6)),
    ("this year", D(2023, 1, 1), D(2023, 5, 6)),
    ("过去三天", D(2023, 5, 3), D(2023, 5, 6)),
    ("今年", D(2023, 1, 1), D(2023, 5, 6)),
    # a named weekday or weekend: the latest before today (TODAY is a Saturday)
    ("last Saturday", D(2023, 4, 29), D(2023, 4, 29)),
    ("this past Monday", D(2023, 5, 1), D(2023, 5, 1)),
    ("last weekend", D(2023, 4, 29), D(2023, 4, 30)),
    ("上周六", D(2023, 4, 29), D(2023, 4, 29)),
    ("上周末", D(2023, 4, 29), D(2023, 4, 30)),
    ("last year", D(2022, 1, 1), D(2022, 12, 31)),
    ("去年", D(2022, 1, 1), D(2022, 12, 31)),
]


@pytest.mark.parametrize("text, first, last", NAMED_DAYS)
def test_named_days(text: str, first: dt.date, last: dt.date) -> None:
    assert asked_days(text, TODAY) == DaySpan(first, last)


@pytest.mark.parametrize("text", ["a few days ago I said", "recently", "what may 2 people do", "April 31st", "the 40th",
                                  "my cat", "", "a few weeks ago", "on Fridays", "this weekend", "the weekend",
                                  "a holiday someday", "on the last day of the trip"])
def test_no_day_or_a_vague_one(text: str) -> None:
    assert asked_days(text, TODAY) is None


@pytest.mark.parametrize("text", [text for text, _, _ in NAMED_DAYS])
def test_a_time_blanked_out_names_no_day(text: str) -> None:
    assert asked_days(without_times(text), TODAY) is None


@pytest.mark.parametrize("text, left", [
    ("What kitchen appliance did I buy 10 days ago?", "What kitchen appliance did I buy ?"),
    ("Who did I go with to the music event last Saturday?", "Who did I go with to the music event ?"),
    ("How many times did I bake something in the past two weeks?", "How many times did I bake something in ?"),
    ("I mentioned cooking something for my friend a couple of days ago. What was it?",
     "I mentioned cooking something for my friend . What was it?"),
    ("the gift I bought on May 2nd, a few weeks ago", "the gift I bought on ,"),  # vague times too
    ("what did I buy on May 2?", "what did I buy on ?"),  # read as a day: blanked too
    ("我三天前买了什么", "我 买了什么"),
    ("前几天买的书", "买的书"),
])
def test_the_times_a_text_names_are_blanked_out(text: str, left: str) -> None:
    assert " ".join(without_times(text).split()) == left


@pytest.mark.parametrize("text", ["what may 2 people do", "my cat", "the 40th", ""])
def test_a_text_naming_no_time_is_left_as_it_is(text: str) -> None:
    assert without_times(text) == text


def test_pages_of_the_day_climb_but_no_page_joins() -> None:
    days = {"a": D(2023, 5, 1), "b": D(2023, 5, 2), "c": D(2023, 5, 1), "d": D(2023, 5, 2)}
    ranking = [("a", 9.0), ("c", 5.0), ("b", 4.0)]
    span = DaySpan(D(2023, 5, 2), D(2023, 5, 2))
    preferred = prefer_days(ranking, days.get, span)
    assert [label for label, _ in preferred] == ["b", "a", "c"]  # "d" was not found: it stays out
    assert [score for _, score in prefer_days(ranking, days.get, span, keep_scores=True)] == [4.0, 9.0, 5.0]
    assert prefer_days(ranking, days.get, DaySpan(D(2023, 6, 1), D(2023, 6, 1))) == ranking


def test_the_weekday_and_weekend_before_today_when_today_is_one() -> None:
    sunday = D(2023, 5, 7)
    assert asked_days("last Sunday", sunday) == DaySpan(D(2023, 4, 30), D(2023, 4, 30))
    assert asked_days("last weekend", sunday) == DaySpan(D(2023, 4, 29), D(2023, 4, 30))
    assert asked_days("last weekend", D(2023, 5, 8)) == DaySpan(D(2023, 5, 6), D(2023, 5, 7))  # a Monday


def test_pages_told_of_after_the_asked_days_climb_less() -> None:
    days = {"a": D(2023, 5, 1), "b": D(2023, 5, 2), "c": D(2023, 5, 4), "d": D(2023, 5, 9)}
    ranking = [("d", 9.0), ("a", 8.0), ("c", 5.0), ("b", 4.0)]
    span = DaySpan(D(2023, 5, 2), D(2023, 5, 2))
    preferred = [label for label, _ in prefer_days(ranking, days.get, span, until=D(2023, 5, 6))]
    assert preferred == ["b", "c", "d", "a"]  # the asked day first, the day after it next; "d" is after today
    assert [label for label, _ in prefer_days(ranking, days.get, span)] == ["b", "d", "a", "c"]


def _dated_context(pages: dict[int, tuple[str, str]]) -> RecallContext:
    def stamp(day: str) -> float:
        return dt.datetime.fromisoformat(day).replace(hour=12, tzinfo=dt.timezone.utc).timestamp()

    messages = [{"role": "user", "content": text} for text, _ in pages.values()]
    records = [PageRecord(number=n, part=1, start=i, end=i + 1, tokens=20, status=ARCHIVED, first_seen=stamp(day))
               for i, (n, (_, day)) in enumerate(pages.items())]
    return RecallContext("t1", "c1", ConversationState(pages=records), messages)


PAGES = {1: ("I ran in the park for an hour, a long run.", "2023-05-01"),
         2: ("A short run today.", "2023-05-02"),
         3: ("Park run, a very long run in the park, the best run.", "2023-05-03"),
         4: ("Dinner plans with Anna.", "2023-05-02"), 5: ("A new phone.", "2023-05-04"), 6: ("Tax forms.", "2023-05-05")}


async def test_the_search_prefers_the_asked_day_and_shows_the_dates() -> None:
    now = dt.datetime(2023, 5, 6, 9, tzinfo=dt.timezone.utc).timestamp()
    resolver = RecallResolver(None, EstimateCounter(), 2048, clock=lambda: now)
    ctx = _dated_context(PAGES)
    undated = await resolver.search(ctx, "long run park", 3)
    assert undated[0][0] != "2"
    dated = await resolver.search(ctx, "long run park on May 2nd", 3)
    assert dated[0][0] == "2"
    assert {label: score for label, score in dated} == {label: score for label, score in
                                                        await resolver.search(ctx, "long run park May 2nd", 3)}
    # lexical scores are kept (the push's floor compares them), only the order changes
    assert sorted(score for _, score in dated) == sorted(score for _, score in await resolver.search(
        ctx, "long run park on the 2nd of March", 3))
    assert day_of(now) == TODAY
    outcome = await resolver.resolve(ctx, RecallArgs(query="run park yesterday"))
    assert "[Page 2] 2023-05-02, score" in outcome.text  # the page's day beside each hit
