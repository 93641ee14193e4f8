"""BM25 index against a brute-force reference, plus filtering, removal and serialisation."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.lexical.text import tokenize


def reference_scores(
    docs: dict[int, list[str]], query: list[str], k1: float = 1.2, b: float = 0.75
) -> dict[int, float]:
    """BM25 straight from its definition, recomputing every statistic (unique query terms)."""
    n_docs = len(docs)
    avgdl = sum(len(terms) for terms in docs.values()) / n_docs
    scores: dict[int, float] = {}
    for doc_id, terms in docs.items():
        counts = Counter(terms)
        total = 0.0
        matched = False
        for term in set(query):
            df = sum(1 for other in docs.values() if term in other)
            tf = counts[term]
            if tf == 0:
                continue
            matched = True
            idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
            total += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(terms) / avgdl))
        if matched:
            scores[doc_id] = total
    return scores


VOCABULARY = [f"w{i}" for i in range(12)]
documents = st.dictionaries(
    st.integers(min_value=0, max_value=40),
    st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=30),
    min_size=1,
    max_size=15,
)
queries = st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=5)


def build(docs: dict[int, list[str]], **kwargs: float) -> BM25Index:
    index = BM25Index(**kwargs)
    for doc_id, terms in docs.items():
        index.add_terms(doc_id, terms)
    return index


@settings(max_examples=150, deadline=None)
@given(documents, queries)
def test_scores_equal_the_reference(docs: dict[int, list[str]], query: list[str]) -> None:
    index = build(docs)
    expected = reference_scores(docs, query)
    got = dict(index.search(" ".join(query), k=len(docs) + 5, min_score=float("-inf")))
    assert got.keys() == expected.keys()
    for doc_id, score in expected.items():
        assert got[doc_id] == pytest.approx(score, rel=1e-9, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(documents, queries, st.floats(min_value=0.0, max_value=3.0), st.floats(min_value=0.0, max_value=1.0))
def test_scores_equal_the_reference_for_any_k1_and_b(
    docs: dict[int, list[str]], query: list[str], k1: float, b: float
) -> None:
    got = build(docs, k1=k1, b=b).score_all(dict.fromkeys(query, 1.0))
    index = build(docs, k1=k1, b=b)
    by_id = {index._id_of[slot]: score for slot, score in got.items()}  # same insertion order -> same slots
    expected = reference_scores(docs, query, k1=k1, b=b)
    assert by_id.keys() == expected.keys()
    for doc_id, score in expected.items():
        assert by_id[doc_id] == pytest.approx(score, rel=1e-9, abs=1e-12)


@settings(max_examples=100, deadline=None)
@given(documents, queries, st.integers(min_value=1, max_value=8))
def test_results_are_ranked_unique_and_at_most_k(docs: dict[int, list[str]], query: list[str], k: int) -> None:
    results = build(docs).search(" ".join(query), k=k, min_score=0.0)
    ids = [doc_id for doc_id, _ in results]
    scores = [score for _, score in results]
    assert len(ids) == len(set(ids)) <= k
    assert scores == sorted(scores, reverse=True)


@settings(max_examples=100, deadline=None)
@given(documents, queries, st.data())
def test_remove_equals_never_added(docs: dict[int, list[str]], query: list[str], data: st.DataObject) -> None:
    removed = data.draw(st.sets(st.sampled_from(sorted(docs))))
    index = build(docs)
    for doc_id in removed:
        assert index.remove(doc_id)
    kept = {doc_id: terms for doc_id, terms in docs.items() if doc_id not in removed}
    got = dict(index.search(" ".join(query), k=100, min_score=float("-inf")))
    expected = reference_scores(kept, query) if kept else {}
    assert got.keys() == expected.keys()
    for doc_id, score in expected.items():
        assert got[doc_id] == pytest.approx(score, rel=1e-9, abs=1e-12)
    assert len(index) == len(kept)


@settings(max_examples=60, deadline=None)
@given(documents, queries, st.data())
def test_serialised_index_searches_and_updates_like_the_original(
    docs: dict[int, list[str]], query: list[str], data: st.DataObject
) -> None:
    index = build(docs)
    restored_bytes = BM25Index.from_bytes(index.to_bytes())
    restored_state = BM25Index.from_state(index.to_state())
    text = " ".join(query)
    for restored in (restored_bytes, restored_state):
        assert restored.search(text, k=50, min_score=0.0) == index.search(text, k=50, min_score=0.0)
    victim = data.draw(st.sampled_from(sorted(docs)))
    for each in (index, restored_bytes, restored_state):
        each.remove(victim)
        each.add_terms(1000, query)
    expected = index.search(text, k=50, min_score=0.0)
    assert restored_bytes.search(text, k=50, min_score=0.0) == expected
    assert restored_state.search(text, k=50, min_score=0.0) == expected


def test_min_score_filters_on_the_raw_score() -> None:
    index = BM25Index()
    index.add("strong", "penguin penguin penguin zoo")
    index.add("weak", " ".join(["penguin"] + ["filler"] * 200))
    for i in range(20):
        index.add(f"other{i}", f"unrelated words number {i}")
    all_hits = dict(index.search("penguin", k=10, min_score=float("-inf")))
    assert set(all_hits) == {"strong", "weak"}
    threshold = (all_hits["strong"] + all_hits["weak"]) / 2
    assert [doc_id for doc_id, _ in index.search("penguin", k=10, min_score=threshold)] == ["strong"]
    assert index.search("penguin", k=10, min_score=all_hits["strong"] + 1) == []


def test_default_min_score_is_seed_001s_threshold() -> None:
    index = BM25Index()
    for i in range(10):
        index.add(i, "common word " + ("rare" if i == 3 else "plain"))
    # "common" is in every page: its idf is ln(1 + 0.5/10.5) ~ 0.047, below 0.2 -> no hit by default
    assert index.search("common") == []
    assert [doc_id for doc_id, _ in index.search("rare")] == [3]


def test_adding_an_existing_id_replaces_the_document() -> None:
    index = BM25Index()
    index.add("p1", "apples and oranges")
    index.add("p2", "kiwi")
    index.add("p1", "bananas")
    assert len(index) == 2
    assert index.search("apples", min_score=0.0) == []
    assert [doc_id for doc_id, _ in index.search("bananas", min_score=0.0)] == ["p1"]


def test_remove_unknown_id_and_empty_index() -> None:
    index = BM25Index()
    assert index.search("anything") == []
    assert not index.remove("missing")
    index.add(1, "solo page")
    assert index.remove(1)
    assert len(index) == 0 and index.search("solo", min_score=0.0) == []
    index.add(2, "solo again")
    assert [doc_id for doc_id, _ in index.search("solo", min_score=0.0)] == [2]


def test_chinese_pages_are_searchable() -> None:
    index = BM25Index()
    index.add(1, "上次部署使用了 Cloudflare Workers，遇到了超时问题")
    index.add(2, "用户偏好使用 pnpm 而非 npm")
    index.add(3, "今天天气很好，我们去公园散步")
    assert index.search("部署超时", k=1)[0][0] == 1
    assert index.search("pnpm", k=1)[0][0] == 2


def test_weighted_query_prefers_heavier_terms() -> None:
    index = BM25Index()
    index.add("a", "kite beach")
    index.add("b", "piano lesson")
    index.add("c", "filler text")
    heavy_kite = index.search_weighted({"kit": 2.0, "piano": 1.0}, min_score=0.0)
    heavy_piano = index.search_weighted({"kit": 1.0, "piano": 2.0}, min_score=0.0)
    assert heavy_kite[0][0] == "a" and heavy_piano[0][0] == "b"
    assert tokenize("kite") == ["kit"]


def test_invalid_parameters_and_state_are_rejected() -> None:
    with pytest.raises(ValueError):
        BM25Index(k1=-1)
    with pytest.raises(ValueError):
        BM25Index(b=1.5)
    state = BM25Index().to_state()
    with pytest.raises(ValueError):
        BM25Index.from_state({**state, "version": 99})


skewed_documents = st.lists(
    st.lists(
        st.sampled_from(VOCABULARY[:3] * 8 + VOCABULARY),  # a few very common words, as in real text
        min_size=1,
        max_size=40,
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    skewed_documents,
    st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=8),
    st.integers(min_value=1, max_value=5),
    st.sampled_from([float("-inf"), 0.0, 0.2, 1.0, 3.0]),
)
def test_pruned_top_k_equals_exhaustive_top_k(
    docs: list[list[str]], query: list[str], k: int, min_score: float
) -> None:
    index = BM25Index()
    for doc_id, terms in enumerate(docs):
        index.add_terms(doc_id, terms)
    weights = dict.fromkeys(query, 1.0)
    exhaustive = sorted(
        ((score, -slot) for slot, score in index.score_all(weights).items() if score >= min_score), reverse=True
    )[:k]
    expected = [(index._id_of[-neg_slot], score) for score, neg_slot in exhaustive]
    assert index.search_weighted(weights, k=k, min_score=min_score) == expected


def test_non_positive_weights_are_ignored() -> None:
    index = BM25Index()
    index.add(1, "alpha beta")
    index.add(2, "gamma")
    assert index.search_weighted({"alpha": -1.0, "gamma": 0.0}, min_score=float("-inf")) == []


def test_plain_state_survives_a_json_round_trip() -> None:
    import json

    index = BM25Index()
    index.add(1, "penguins at the zoo")
    index.add("page-2", "kites on the beach")
    index.remove(1)
    index.add(3, "zoo trip with penguins")
    restored = BM25Index.from_state(json.loads(json.dumps(index.to_state())))
    assert restored.doc_ids == ["page-2", 3]
    assert restored.search("penguin zoo", min_score=0.0) == index.search("penguin zoo", min_score=0.0)
    restored.remove("page-2")
    assert restored.search("kite", min_score=0.0) == []


@settings(max_examples=80, deadline=None)
@given(skewed_documents, st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=10), st.integers(0, 6))
def test_max_terms_keeps_the_rarest_terms(docs: list[list[str]], query: list[str], max_terms: int) -> None:
    index = BM25Index()
    for doc_id, terms in enumerate(docs):
        index.add_terms(doc_id, terms)
    present = [t for t in dict.fromkeys(query) if index.document_frequency(t)]
    kept = sorted(present, key=lambda t: (-index.idf(t), t))[:max_terms]
    expected = index.search_weighted(dict.fromkeys(kept, 1.0), k=5, min_score=0.0)
    assert index.search(" ".join(query), k=5, min_score=0.0, max_terms=max_terms) == expected
