"""The steps of the recall search's ranking (memci_proxy.recall.search.ranking)."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.dates.asked import DaySpan
from memci_proxy.recall.lexical.counting import COUNTED, counted_form
from memci_proxy.recall.reading.pagetext import index_terms, user_text
from memci_proxy.recall.search.ranking import (PAGE, USER, DayPreference, best_views, candidate_views,
                                               lexical_candidates, TIME_WEIGHT, lexical_ranking, preferred_days,
                                               query_weights, vector_query)
from memci_proxy.recall.lexical.text import tokenize

D = dt.date


def searched(query: str) -> list[str]:
    """The query's own terms (not their counted forms)."""
    return [term for term in query_weights(query) if not term.startswith(COUNTED)]


def test_the_kind_of_answer_a_question_asks_for_is_not_searched() -> None:
    assert searched("How many weddings did I attend?") == tokenize("weddings attend")
    assert list(query_weights("how long was I in Japan for")) == ["japan"]
    assert list(query_weights("many friends came, for a long time")) == tokenize("many friends came long time")
    assert searched("how many?") == tokenize("many")  # nothing else to search: kept
    assert query_weights("How much did Anna pay?", entity_boost=2.0) == {"anna": 2.0, "pay": 1.0}


def test_the_times_a_query_names_weigh_less() -> None:
    weights = query_weights("What kitchen appliance did I buy 10 days ago?")
    assert weights == {**dict.fromkeys(tokenize("kitchen appliance buy"), 1.0),
                       **dict.fromkeys(tokenize("10 days ago"), TIME_WEIGHT)}
    # a word the time holds and the rest of the query too weighs in full
    weights = query_weights("what did I plan for the week, two weeks ago?")
    assert weights[tokenize("week")[0]] == 1.0
    assert query_weights("my gym locker code") == dict.fromkeys(tokenize("gym locker code"), 1.0)
    assert query_weights("yesterday") == {tokenize("yesterday")[0]: TIME_WEIGHT}  # a time alone is still searched


def test_a_count_weighs_the_counted_form_of_each_term_as_the_term() -> None:
    weights = query_weights("How many rare coins did I buy in the past two months?", entity_boost=2.0)
    for term in tokenize("rare coins buy"):
        assert weights[counted_form(term)] == weights[term] == 1.0
    for term in tokenize("past two months"):
        assert weights[counted_form(term)] == weights[term] == TIME_WEIGHT
    assert not any(term.startswith(COUNTED) for term in query_weights("Which rare coins did I buy?"))


def test_a_count_ranks_the_page_that_gives_a_count_above_those_that_only_name_what_it_counts() -> None:
    pages = {
        "decoy-1": "Where can I buy rare figurines? I love rare figurines.",
        "decoy-2": "How should I dust rare figurines? My rare figurines get dusty.",
        "figurines": "By the way, I have 12 rare figurines in my collection.",
        **{f"chat-{n}": f"Chit-chat about the weather and the news, {n} of 30." for n in range(30)},
    }
    index = BM25Index()
    for label, text in pages.items():
        index.add_terms(label, index_terms([{"role": "user", "content": text}], user_weight=2))
    asked = [label for label, _ in lexical_candidates(index, query_weights("Which rare figurines do I like?"), 3)]
    assert asked[-1] == "figurines"
    counted = [label for label, _ in lexical_candidates(index, query_weights("How many rare figurines do I have?"), 3)]
    assert counted[0] == "figurines"


def test_a_page_saying_the_same_time_of_something_else_does_not_outrank_the_one_asked_for() -> None:
    pages = {"smoker": "I just got a smoker and I'm excited to try it with brisket",
             "amp": "I bought a new guitar amp two weeks ago, a few days after the concert",
             **{str(n): f"a page about the weather number {n}" for n in range(20)}}
    query = "what smoker-ish kitchen appliance did I buy two weeks ago?"
    index = _index(pages)
    before = index.search_weighted(dict.fromkeys(tokenize(query), 1.0), k=2)
    assert before[0][0] == "amp"  # the time's words alone outweigh the one word of the thing asked for
    assert lexical_candidates(index, query_weights(query), 2)[0][0] == "smoker"


def test_the_vector_half_embeds_the_query_without_its_times() -> None:
    assert vector_query("Who did I go with to the music event last Saturday?") == \
        "Who did I go with to the music event ?"
    assert vector_query("my gym locker code") == "my gym locker code"
    assert vector_query("yesterday") == "yesterday"  # nothing else: kept


def _index(pages: dict[str, str]) -> BM25Index:
    index = BM25Index()
    for label, text in pages.items():
        index.add(label, text)
    return index


def test_pages_of_the_asked_days_join_the_candidates() -> None:
    pages = {str(n): "concert tickets concert" if n < 9 else "a grocery list" for n in range(1, 30)}
    pages["9"] = "concert with my parents"
    days = {label: D(2023, 4, 1) for label in pages} | {"9": D(2023, 4, 15)}
    preference = preferred_days("who came to the concert last Saturday", D(2023, 4, 22), lambda: days)
    assert preference is not None and preference.span == DaySpan(D(2023, 4, 15), D(2023, 4, 15))
    weights = query_weights("who came to the concert last Saturday")
    assert "9" not in dict(lexical_candidates(_index(pages), weights, 3))
    found = lexical_candidates(_index(pages), weights, 3, preference)
    assert "9" in dict(found) and len(found) == 4
    assert [score for _, score in found] == sorted((score for _, score in found), reverse=True)
    assert lexical_ranking(found, preference)[0][0] == "9"  # it climbs, its BM25 score kept
    assert dict(lexical_ranking(found, preference)) == dict(found)
    assert preferred_days("the concert", D(2023, 4, 22), lambda: {}) is None


def test_a_page_told_of_after_the_asked_days_up_to_today_is_held() -> None:
    days = {"a": D(2023, 4, 15), "b": D(2023, 4, 20), "c": D(2023, 4, 23), "d": D(2023, 4, 1)}
    preference = DayPreference(DaySpan(D(2023, 4, 15), D(2023, 4, 15)), D(2023, 4, 22), days)
    assert preference.held() == ["a", "b"]


def test_the_user_words_of_every_candidate_are_embedded_first() -> None:
    views = candidate_views(["3", "1", "2"], lambda label: label != "1")
    assert views == [("3", USER), ("2", USER), ("3", PAGE), ("1", PAGE), ("2", PAGE)]
    assert best_views([(("3", USER), 0.5), (("2", USER), 0.1), (("3", PAGE), 0.2), (("1", PAGE), 0.3),
                       (("2", PAGE), 0.4)]) == [("3", 0.5), ("2", 0.4), ("1", 0.3)]


@given(st.dictionaries(st.integers(0, 30), st.lists(st.sampled_from("abcdef"), min_size=1, max_size=12), min_size=1),
       st.dictionaries(st.sampled_from("abcdef"), st.floats(0.5, 3.0), min_size=1), st.integers(1, 10))
def test_a_search_within_some_pages_ranks_them_as_the_whole_search_does(
        documents: dict[int, list[str]], weights: dict[str, float], k: int) -> None:
    index = BM25Index()
    for doc, terms in documents.items():
        index.add_terms(doc, terms)
    everything = index.search_weighted(weights, k=len(documents), min_score=0.2)
    even = index.search_weighted(weights, k=k, min_score=0.2, within=[doc for doc in range(-3, 40) if doc % 2 == 0])
    assert even == [(doc, score) for doc, score in everything if doc % 2 == 0][:k]


def test_the_user_words_of_a_page() -> None:
    page = [{"role": "user", "content": "my gym code is 7349"}, {"role": "assistant", "content": "Noted."},
            {"role": "tool", "content": "ok"}]
    assert user_text(page) == "user: my gym code is 7349"
    assert user_text(page[1:]) == ""
    assert user_text([{"role": "user", "content": "  "}]) == ""  # says nothing: no vector


def test_words_naming_the_kind_of_answer_are_not_searched() -> None:
    assert searched("What is the total number of online courses I've completed?") == tokenize("online courses completed")
    assert searched("How much total money did I spend on bikes?") == tokenize("money spend bikes")
    assert searched("How many months have passed since I ran the charity race?") == tokenize("ran charity race")
    assert searched("How many days passed between the workshop and the planting?") == tokenize("workshop planting")
    assert searched("Which exam have I passed?") == tokenize("exam passed")  # what it is about: kept
