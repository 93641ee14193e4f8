"""Entity terms (proper nouns, numbers, codes) and the boosted query of the recall search."""

from __future__ import annotations

from memci_proxy.engine import EstimateCounter
from memci_proxy.recall.lexical.entities import boosted_query, entity_terms
from memci_proxy.recall.resolver import RecallResolver
from tests.unit.recall.search.test_embeddings_fusion import _context


def test_proper_nouns_numbers_and_codes_but_not_sentence_starts() -> None:
    terms = entity_terms("Yesterday I met Brioche in Lyon. The code was 7349, ticket AB-12 on 2023-05-02.")
    assert {"brioch", "lyon", "7349", "ab", "12", "2023"} <= terms  # stemmed like the index
    assert "yesterday" not in terms and "the" not in terms  # capitals that only start a sentence
    assert entity_terms("just lower case words here") == set()


def test_boost_multiplies_entity_terms_only() -> None:
    weights = {"locker": 1.0, "7349": 1.0}
    assert boosted_query(weights, "my locker 7349", 2.0) == {"locker": 1.0, "7349": 2.0}
    assert boosted_query(weights, "my locker 7349", 1.0) == weights


async def test_the_boost_lets_a_name_outrank_common_words() -> None:
    pages = {1: "The meeting about the budget and the meeting notes and the budget meeting.",
             2: "Lunch with Brioche on Tuesday.",
             3: "Another meeting, budget again."}
    query = "meeting budget Brioche"
    plain = RecallResolver(None, EstimateCounter(), 2048, entity_boost=1.0)
    boosted = RecallResolver(None, EstimateCounter(), 2048, entity_boost=3.0)
    ctx = _context(pages)
    assert (await plain.search(ctx, query, 3, use_vectors=False))[0][0] != "2"
    assert (await boosted.search(ctx, query, 3, use_vectors=False))[0][0] == "2"
