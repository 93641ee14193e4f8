"""The recall evaluation pipeline runs on a small slice of MADial-Bench (skipped when the data is absent)."""

from __future__ import annotations

import zlib

import pytest

from loadtests.evals.eval_recall import STRATEGIES, build_query, evaluate_madial, score_ranking
from loadtests.evals.evaldata import load_madial_bench
from memci_proxy.recall.lexical.text import tokenize


def bag_of_words_embedding(texts: list[str], dimensions: int = 128) -> list[list[float]]:
    vectors = []
    for text in texts:
        vector = [0.0] * dimensions
        for term in tokenize(text):
            vector[zlib.crc32(term.encode()) % dimensions] += 1.0
        vectors.append(vector)
    return vectors


def test_score_ranking() -> None:
    assert score_ranking([3, 1, 2], [1, 9]) == (0.0, 0.5, 0.0, 1.0, 0.5)
    assert score_ranking([], [1]) == (0.0, 0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        score_ranking([1], [])


@pytest.fixture(scope="module")
def bench():
    data = load_madial_bench()
    if data is None:
        pytest.skip("MADial-Bench data not found (../shared/eval or MEMCI_EVAL_DIR)")
    return data


def test_madial_structure(bench) -> None:
    assert len(bench.dialogues) == 160 and len(bench.memories) == 160
    users = {d.user_id for d in bench.dialogues}
    for dialogue in bench.dialogues[:20]:
        candidate_ids = {m.id for m in bench.memories_of(dialogue.user_id)}
        assert set(dialogue.relevant_ids) <= candidate_ids
    assert users == {m.user_id for m in bench.memories}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_queries_use_only_the_context_before_the_test_turn(bench, strategy: str) -> None:
    dialogue = bench.dialogues[0]
    later = set(tokenize(" ".join(dialogue.lines[dialogue.test_turns[0] :])))
    earlier = set(tokenize(" ".join(dialogue.lines[: dialogue.test_turns[0]])))
    query = build_query(dialogue, strategy)
    assert query and set(query) <= earlier
    assert not (set(query) & (later - earlier))


def test_lexical_and_fused_pipeline_on_a_slice(bench) -> None:
    results = evaluate_madial(bench, limit=12, embed=bag_of_words_embedding)
    assert set(results) == {"lexical", "vector", "default", "user-first", "archive"}
    for metrics in results.values():
        assert metrics.queries == 12
        assert 0.0 <= metrics.recall_at_1 <= metrics.recall_at_5 <= 1.0
        assert metrics.hit_at_1 <= metrics.hit_at_5 and 0.0 <= metrics.mrr <= 1.0
    assert results["lexical"].hit_at_5 > 0.3  # far above chance (5 of ~80 candidates)
    assert results["default"].recall_at_1 == results["lexical"].recall_at_1  # the top lexical hit stays first


def test_loaders_return_none_when_the_data_is_absent(tmp_path, monkeypatch) -> None:
    from loadtests.evals.evaldata import eval_dir, load_memorybank

    monkeypatch.setenv("MEMCI_EVAL_DIR", str(tmp_path / "missing"))
    assert eval_dir() is None
    assert load_madial_bench() is None and load_memorybank() is None
    monkeypatch.setenv("MEMCI_EVAL_DIR", str(tmp_path))
    assert eval_dir() == tmp_path
    assert load_madial_bench() is None and load_memorybank() is None
