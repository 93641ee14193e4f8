"""The evaluation's embedding helpers: the query text variants and the per-text cache."""

from __future__ import annotations

import pytest

from loadtests.evals.eval_recall import VECTOR_QUERIES, caching, vector_query_text
from loadtests.evals.evaldata import MadialDialogue

TEXTS = ["I adopted a dog.", "How nice!", "He barks a lot.", "Walks help.", "Any other tips?",
         "Remember your first pet?"]


def _dialogue() -> MadialDialogue:
    speakers = ["User", "Assistant"] * 3
    lines = ("<BOD>", *(f"<{who}>: {text}" for who, text in zip(speakers, TEXTS)), "<EOD>")
    return MadialDialogue(index=1, user_id=0, lines=lines, test_turns=(6,), relevant_ids=(3,))


def test_vector_query_variants() -> None:
    d = _dialogue()
    assert vector_query_text(d, "context").splitlines() == TEXTS[:5]
    assert vector_query_text(d, "user").splitlines() == ["I adopted a dog.", "He barks a lot.", "Any other tips?"]
    assert vector_query_text(d, "recent-3").splitlines() == ["He barks a lot.", "Walks help.", "Any other tips?"]
    assert set(VECTOR_QUERIES) == {"context", "user", "recent-3"}
    with pytest.raises(ValueError):
        vector_query_text(d, "nope")


def test_caching_asks_once_per_text() -> None:
    asked: list[list[str]] = []

    def embed(texts: list[str]) -> list[list[float]]:
        asked.append(list(texts))
        return [[float(len(t))] for t in texts]

    cached = caching(embed)
    assert cached(["a", "bb", "a"]) == [[1.0], [2.0], [1.0]]
    assert cached(["bb", "ccc"]) == [[2.0], [3.0]]
    assert asked == [["a", "bb"], ["ccc"]]
