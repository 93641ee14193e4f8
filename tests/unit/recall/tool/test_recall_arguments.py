"""The recall tool's arguments as a hostile or confused model writes them: every size is bounded before it is
parsed, and what was wrong comes back as a note the model reads, never an exception."""

from __future__ import annotations

import json

from memci_proxy.recall.tool.schema import (
    MAX_ARGUMENTS_CHARS, MAX_PAGES, MAX_QUERY_CHARS, parse_arguments, parse_lines,
)


def test_a_line_range_of_thousands_of_digits_is_a_note_not_an_exception() -> None:
    digits = "5" * 5000
    for lines in (digits, f"1-{digits}", f"{digits}-", "1" * 12):
        args = parse_arguments(json.dumps({"page": 3, "lines": lines}))
        assert args.lines is None and any("`lines` must be" in p for p in args.problems), lines
        assert all(len(p) < 300 for p in args.problems)  # the huge value is not echoed back whole
    assert parse_lines(10 ** 12) is None and parse_lines([1, 10 ** 15]) == (1, 1 << 30)


def test_too_many_pages_are_cut_to_the_first_with_a_note() -> None:
    labels = list(range(1, 1001))
    args = parse_arguments(json.dumps({"pages": labels + labels}))
    assert args.pages == [str(n) for n in range(1, MAX_PAGES + 1)]
    assert any(f"1000 pages were asked for; at most {MAX_PAGES}" in p for p in args.problems)


def test_arguments_past_the_bound_are_not_parsed() -> None:
    raw = json.dumps({"pages": list(range(40_000))})
    assert len(raw) > MAX_ARGUMENTS_CHARS
    args = parse_arguments(raw)
    assert args.pages == [] and args.query == "" and len(args.problems) == 1
    assert f"at most {MAX_ARGUMENTS_CHARS} are read" in args.problems[0]


def test_a_long_query_is_searched_by_its_first_characters() -> None:
    args = parse_arguments(json.dumps({"query": "word " * 1000}))
    assert len(args.query) == MAX_QUERY_CHARS and any("`query` was" in p for p in args.problems)


def test_bad_page_references_are_noted_briefly() -> None:
    args = parse_arguments(json.dumps({"pages": ["7", "x" * 5000, None, {"a": 1}, [1], True, "9"]}))
    assert args.pages == ["7", "9"]
    (note,) = [p for p in args.problems if p.startswith("ignored page references")]
    assert "and 2 more" in note and len(note) < 200
    assert parse_arguments(json.dumps({"page": "1" * 5000, "lines": "1-3"})).page == ""
