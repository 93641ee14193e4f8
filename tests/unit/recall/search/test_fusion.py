"""Reciprocal-rank fusion of lexical and vector rankings."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.recall.search.fusion import (
    cosine_similarity,
    fuse_lexical_and_vector,
    rank_by_cosine,
    reciprocal_rank_fusion,
)

ids = st.integers(min_value=0, max_value=30)
rankings = st.lists(ids, max_size=20)
scored = st.lists(st.tuples(ids, st.floats(min_value=-1, max_value=50, allow_nan=False)), max_size=20)


def test_known_values() -> None:
    fused = dict(reciprocal_rank_fusion([["a", "b"], ["b", "c"]], rrf_k=60))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 62)
    assert [doc_id for doc_id, _ in reciprocal_rank_fusion([["a", "b"], ["b", "c"]])] == ["b", "a", "c"]


@given(rankings, rankings)
def test_output_is_unique_sorted_and_covers_every_input_id(left: list[int], right: list[int]) -> None:
    fused = reciprocal_rank_fusion([left, right])
    out_ids = [doc_id for doc_id, _ in fused]
    scores = [score for _, score in fused]
    assert len(out_ids) == len(set(out_ids))
    assert set(out_ids) == set(left) | set(right)
    assert scores == sorted(scores, reverse=True)


@given(rankings)
def test_a_single_ranking_keeps_its_order_without_duplicates(ranking: list[int]) -> None:
    deduplicated = list(dict.fromkeys(ranking))
    assert [doc_id for doc_id, _ in reciprocal_rank_fusion([ranking])] == deduplicated


@given(rankings, rankings)
def test_equal_weights_make_fusion_symmetric_in_scores(left: list[int], right: list[int]) -> None:
    assert dict(reciprocal_rank_fusion([left, right])) == pytest.approx(dict(reciprocal_rank_fusion([right, left])))


@given(st.lists(ids, min_size=1, max_size=20, unique=True), rankings)
def test_top_of_both_rankings_wins(left: list[int], right: list[int]) -> None:
    top = left[0]
    right = [top] + [doc_id for doc_id in right if doc_id != top]
    assert reciprocal_rank_fusion([left, right])[0][0] == top


@given(st.lists(ids, min_size=2, max_size=20, unique=True), rankings, st.data())
def test_promoting_an_id_never_lowers_its_score(left: list[int], right: list[int], data: st.DataObject) -> None:
    position = data.draw(st.integers(min_value=1, max_value=len(left) - 1))
    promoted = left[:]
    promoted[position - 1], promoted[position] = promoted[position], promoted[position - 1]
    doc_id = left[position]
    before = dict(reciprocal_rank_fusion([left, right]))[doc_id]
    after = dict(reciprocal_rank_fusion([promoted, right]))[doc_id]
    assert after > before


def test_limit_weights_and_validation() -> None:
    assert len(reciprocal_rank_fusion([[1, 2, 3], [4, 5]], limit=2)) == 2
    assert reciprocal_rank_fusion([[1], [2]], weights=[1.0, 3.0])[0][0] == 2
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([[1], [2]], weights=[1.0])
    with pytest.raises(ValueError):
        reciprocal_rank_fusion([[1]], rrf_k=-1)


@given(scored, scored)
def test_fuse_lexical_and_vector_ranks_each_list_by_its_own_score(lexical: list, vector: list) -> None:
    fused = fuse_lexical_and_vector(lexical, vector, limit=100, anchor=0)
    expected = reciprocal_rank_fusion(
        [
            [doc_id for doc_id, _ in sorted(lexical, key=lambda p: -p[1])],
            [doc_id for doc_id, _ in sorted(vector, key=lambda p: -p[1])],
        ],
        limit=100,
    )
    assert fused == expected


@given(scored, scored, st.integers(min_value=1, max_value=10), st.integers(min_value=1, max_value=4))
def test_the_top_lexical_hits_keep_their_places_whatever_the_vectors_say(lexical: list, vector: list, limit: int,
                                                                         anchor: int) -> None:
    fused = fuse_lexical_and_vector(lexical, vector, limit=limit, anchor=anchor)
    if lexical:
        ranked = list(dict.fromkeys(d for d, _ in sorted(lexical, key=lambda p: -p[1])))
        kept = ranked[: min(anchor, limit)]
        assert [d for d, _ in fused[: len(kept)]] == kept
        assert fused[0][1] == max(score for _, score in fused)
    ids = [doc_id for doc_id, _ in fused]
    assert len(ids) == len(set(ids)) == min(limit, len({d for d, _ in lexical} | {d for d, _ in vector}))


@given(scored, scored)
def test_the_anchor_only_moves_the_top_lexical_hits(lexical: list, vector: list) -> None:
    plain = [d for d, _ in fuse_lexical_and_vector(lexical, vector, limit=100, anchor=0)]
    anchored = [d for d, _ in fuse_lexical_and_vector(lexical, vector, limit=100)]
    if lexical:
        kept = anchored[: min(2, len({d for d, _ in lexical}))]
        assert set(kept) <= {d for d, _ in lexical}
        assert [d for d in anchored if d not in kept] == [d for d in plain if d not in kept]
    else:
        assert anchored == plain


@given(scored, st.data())
def test_vectors_limited_to_the_lexical_candidates_only_reorder_them(lexical: list, data: st.DataObject) -> None:
    ids = list(dict.fromkeys(d for d, _ in lexical))
    cosines = data.draw(st.lists(st.floats(min_value=-1, max_value=1, allow_nan=False), min_size=len(ids),
                                 max_size=len(ids)))
    fused = fuse_lexical_and_vector(lexical, list(zip(ids, cosines)), limit=100)
    assert sorted(d for d, _ in fused) == sorted(ids)


def test_day_preference_applies_before_the_anchor() -> None:
    days = {"a": 1, "b": 2, "c": 2}

    def prefer_day_2(ranking):
        return sorted(ranking, key=lambda p: days[p[0]] != 2)

    fused = fuse_lexical_and_vector([("a", 9.0), ("b", 3.0), ("c", 1.0)], [("c", 0.9)], reorder=prefer_day_2,
                                    anchor=1)
    assert [d for d, _ in fused][:1] == ["b"]  # the lexical top once the asked day climbed


def test_without_vectors_the_lexical_ranking_is_kept() -> None:
    lexical = [("p3", 7.5), ("p1", 2.0), ("p9", 0.4)]
    assert [doc_id for doc_id, _ in fuse_lexical_and_vector(lexical, [])] == ["p3", "p1", "p9"]


def test_min_cosine_drops_weak_vector_candidates() -> None:
    fused = fuse_lexical_and_vector([("a", 1.0)], [("b", 0.9), ("c", 0.1)], min_cosine=0.5)
    assert {doc_id for doc_id, _ in fused} == {"a", "b"}


def test_cosine_helpers() -> None:
    assert cosine_similarity([1.0, 0.0], [2.0, 0.0]) == pytest.approx(1.0)
    assert cosine_similarity([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert cosine_similarity([0.0, 0.0], [1.0, 1.0]) == 0.0
    with pytest.raises(ValueError):
        cosine_similarity([1.0], [1.0, 2.0])
    vectors = {"x": [1.0, 0.0], "y": [1.0, 1.0], "z": [0.0, 1.0]}
    ranked = rank_by_cosine([1.0, 0.1], vectors, k=2)
    assert [doc_id for doc_id, _ in ranked] == ["x", "y"]
    assert ranked[0][1] == pytest.approx(1 / math.sqrt(1.01))
