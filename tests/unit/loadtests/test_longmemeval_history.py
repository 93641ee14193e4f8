"""The LongMemEval loader and history builder (skipped when ../shared/eval is absent)."""

from __future__ import annotations

import pytest

from loadtests.evals.evaldata import load_longmemeval, longmemeval_history

QUESTIONS = load_longmemeval()
pytestmark = pytest.mark.skipif(QUESTIONS is None, reason="LongMemEval data not found (../shared/eval)")


def test_the_dev_half_holds_252_questions_of_six_kinds() -> None:
    assert len(QUESTIONS) == 252
    assert len({q.kind for q in QUESTIONS}) == 6


@pytest.mark.parametrize("index", [0, 1, 100, 251])
def test_a_history_holds_the_evidence_among_fillers_in_date_order(index: int) -> None:
    history = longmemeval_history(QUESTIONS, index, target_messages=500)
    messages = history.messages()
    assert 500 <= len(messages) < 700
    assert messages[0]["role"] == "user"
    own = [history.sessions[p].id for p in history.evidence_sessions]
    assert own == [s.id for s in sorted(history.question.sessions, key=lambda s: (s.date[:10], s.date[-5:]))]
    dates = [(s.date[:10], s.date[-5:]) for s in history.sessions]
    assert dates == sorted(dates)
    flat = [m for s in history.sessions for m in s.messages]
    for i in history.evidence_messages():
        assert messages[i] == flat[i]
    flagged = sum(len(s.evidence) for s in history.question.sessions)
    assert len(history.evidence_messages()) == flagged


def test_the_same_seed_builds_the_same_history() -> None:
    a = longmemeval_history(QUESTIONS, 7, seed=3)
    b = longmemeval_history(QUESTIONS, 7, seed=3)
    c = longmemeval_history(QUESTIONS, 7, seed=4)
    assert a == b
    assert [s.id for s in a.sessions] != [s.id for s in c.sessions]
