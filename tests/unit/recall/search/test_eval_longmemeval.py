"""The LongMemEval page-level harness: paging as the proxy pages, evidence pages, the rankings it compares."""

from __future__ import annotations

import datetime as dt

import pytest

from loadtests.evals.eval_longmemeval import (
    evaluate_longmemeval,
    evidence_pages,
    history_pages,
    page_rankings,
    recall_any,
    report,
    session_day,
)
from loadtests.evals.evaldata import LongMemEvalHistory, LongMemEvalQuestion, LongMemEvalSession, load_longmemeval


def _session(sid: str, date: str, turns: list[tuple[str, str]], evidence: tuple[int, ...] = ()) -> LongMemEvalSession:
    return LongMemEvalSession(sid, date, tuple({"role": r, "content": c} for r, c in turns), evidence)


GYM = _session("s1", "2023/05/02 (Tue) 10:00", [
    ("user", "My gym locker code is PELICAN-8823."), ("assistant", "Noted: a good code."),
    ("user", "Also I swim on Fridays."), ("assistant", "Swimming is great exercise."), ("assistant", "Anything else?"),
], evidence=(0,))
COOK = _session("s2", "2023/05/09 (Tue) 18:30", [
    ("user", "How long should pasta boil?"), ("assistant", "About ten minutes for most shapes of pasta."),
])
QUESTION = LongMemEvalQuestion("q1", "single-session-user", "What is my gym locker code?", "PELICAN-8823",
                               "2023/06/01 (Thu) 09:00", (GYM,))


def _history() -> LongMemEvalHistory:
    return LongMemEvalHistory(QUESTION, (GYM, COOK), (0,))


def test_pages_are_a_user_message_and_what_follows_dated_by_their_session() -> None:
    pages = history_pages(_history())
    assert [(p.start, p.end) for p in pages] == [(0, 2), (2, 5), (5, 7)]
    assert [p.day for p in pages] == [dt.date(2023, 5, 2), dt.date(2023, 5, 2), dt.date(2023, 5, 9)]
    assert pages[0].text.startswith("user: My gym locker code")
    assert evidence_pages(_history(), pages) == [0]
    assert session_day("2023/08/16 (Wed) 03:47") == dt.date(2023, 8, 16)


def test_recall_any_counts_one_relevant_page_in_the_top_k() -> None:
    assert recall_any([3, 1, 2], [2]) == 1.0
    assert recall_any([3, 1, 2, 4, 5, 6], [6]) == 0.0
    assert recall_any([], [1]) == 0.0


def test_rankings_lexical_only_and_with_vectors() -> None:
    pages = history_pages(_history())
    lexical = page_rankings(pages, QUESTION.question, dt.date(2023, 6, 1), None)
    assert set(lexical) == {"lexical"} and lexical["lexical"][0] == 0

    def embed(texts: list[str]) -> list[list[float]]:
        return [[float("gym" in t.lower()), float("pasta" in t.lower()), 1.0] for t in texts]

    ranked = page_rankings(pages, QUESTION.question, dt.date(2023, 6, 1), embed)
    assert set(ranked) == {"lexical", "vector", "default", "user-first", "archive"}
    assert ranked["default"][0] == ranked["user-first"][0] == ranked["lexical"][0] == 0
    assert sorted(ranked["vector"]) == [0, 1, 2]


def test_candidates_only_embeds_the_candidates_views_and_ranks_the_same() -> None:
    pages = history_pages(_history())
    embedded: list[str] = []

    def embed(texts: list[str]) -> list[list[float]]:
        embedded.extend(texts)
        return [[float("gym" in t.lower()), float("pasta" in t.lower()), 1.0] for t in texts]

    whole = page_rankings(pages, QUESTION.question, dt.date(2023, 6, 1), embed)
    embedded.clear()
    quick = page_rankings(pages, QUESTION.question, dt.date(2023, 6, 1), embed, candidates_only=True)
    assert set(quick) == {"lexical", "default", "user-first"}
    assert all(quick[name] == whole[name] for name in quick)
    assert len(embedded) < len(pages) + 1 + sum(1 for p in pages if any(m["role"] == "user" for m in p.messages))


def test_evaluation_per_question_type_and_report() -> None:
    questions = load_longmemeval()
    if questions is None:
        pytest.skip("LongMemEval data not found (../shared/eval or MEMCI_EVAL_DIR)")
    results = evaluate_longmemeval(questions, lambda pages, q, day: page_rankings(pages, q, day, None), limit=6,
                                   target_messages=120)
    assert set(results) == {"lexical"}
    assert 0 < len(results["lexical"]["all"]) <= 6
    assert sum(len(v) for k, v in results["lexical"].items() if k != "all") == len(results["lexical"]["all"])
    lines = report(results)
    assert lines[1].startswith("lexical")
