"""The rewrite evaluation runs on a small slice of TREC CAsT and MADial-Bench (skipped when the data is absent)."""

from __future__ import annotations

import pytest

from loadtests.evals.eval_rewrite import (
    CastTurn,
    evaluate_cast,
    evaluate_retrieval,
    exact_match,
    load_cast,
    raw_rewriter,
    rules_rewriter,
    score_rewrites,
    token_f1,
)
from loadtests.evals.evaldata import load_madial_bench


def test_token_f1_and_exact_match() -> None:
    assert token_f1("Is throat cancer treatable?", "Is throat cancer treatable") == 1.0
    precision, recall = 2 / 3, 2 / 4
    assert token_f1("Is it treatable?", "Is throat cancer treatable?") == pytest.approx(
        2 * precision * recall / (precision + recall)
    )
    assert token_f1("The cat", "a cat.") == 1.0 and token_f1("dog", "cat") == 0.0
    assert exact_match("What is Lyme disease?", "what is lyme disease") == 1.0


def test_added_token_scores() -> None:
    turn = CastTurn("Is it treatable?", "Is throat cancer treatable?")
    scores = score_rewrites([("Is it throat cancer treatable?", turn)])
    assert (scores.added_precision, scores.added_recall) == (100.0, 100.0)
    assert score_rewrites([("Is it treatable?", turn)]).added_f1 == 0.0


@pytest.mark.parametrize("year", [2019, 2020])
def test_rules_beat_the_raw_question_on_a_slice(year: int) -> None:
    conversations = load_cast(year)
    if conversations is None:
        pytest.skip("TREC CAsT data not found (../shared/eval or MEMCI_EVAL_DIR)")
    assert len(conversations) == {2019: 50, 2020: 25}[year]
    floor = evaluate_cast(conversations, raw_rewriter, limit=8)
    rules = evaluate_cast(conversations, rules_rewriter, limit=8)
    assert floor.turns == rules.turns > 40
    assert rules.f1 > floor.f1 and rules.added_precision > 30.0


def test_retrieval_pipeline_on_a_slice() -> None:
    bench = load_madial_bench()
    if bench is None:
        pytest.skip("MADial-Bench data not found (../shared/eval or MEMCI_EVAL_DIR)")
    results = evaluate_retrieval(bench, limit=10)
    assert results["raw last user"].queries == 10
    assert all(0.0 <= r.recall_at_5 <= 1.0 for name, r in results.items() if not name.startswith("_"))
