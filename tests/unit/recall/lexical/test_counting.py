"""What a number counts (memci_proxy.recall.lexical.counting): the counted terms of what the user says, and the messages
that ask for a count or a total."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.recall.lexical.counting import COUNTED, counted_form, counted_terms, counts
from memci_proxy.recall.reading.pagetext import index_terms
from memci_proxy.recall.lexical.text import tokenize


def counted(text: str) -> list[str]:
    return [counted_form(term) for term in tokenize(text)]


def test_a_number_counts_the_words_after_it() -> None:
    assert counted_terms("By the way, I have 12 rare figurines in my collection.") == counted("rare figurines")
    assert counted_terms("I've already completed 12 courses on Coursera") == counted("courses Coursera")  # "on": a stop word
    assert counted_terms("We adopted three kittens and two dogs") == counted("kittens adopted")[:1] + counted("dogs")
    assert counted_terms("I ran 5 km in 3.5 hours") == counted("km hours")
    assert counted_terms("a dozen eggs") == counted("eggs")


def test_a_number_counts_words_of_its_own_sentence_only() -> None:
    assert counted_terms("I paid $120. Great shop!") == []
    assert counted_terms("That was 3; then more") == []
    assert counted_terms("The version is 3.5 now") == counted("now")  # the point of 3.5 ends no sentence
    assert counted_terms("no numbers here at all") == []


def test_a_chinese_number_counts_the_characters_after_it() -> None:
    assert counted_terms("我收集了25枚稀有硬币") == counted("稀有硬币")
    assert counted_terms("我家养了两只猫和三本书") == counted("猫和") + counted("书")
    assert counted_terms("我们一起去吧，十分好") == []  # numerals without a classifier count nothing


def test_a_page_holds_its_counted_terms_once_and_only_of_what_the_user_said() -> None:
    page = [{"role": "user", "content": "I have 12 rare figurines."},
            {"role": "assistant", "content": "Nice! 12 rare figurines is a fine collection."}]
    terms = index_terms(page, user_weight=2)
    assert [t for t in terms if t.startswith(COUNTED)] == counted("rare figurines")
    assert not any(t.startswith(COUNTED) for t in index_terms(page[1:], user_weight=2))


def test_messages_asking_for_a_count_or_a_total() -> None:
    for text in ("How many rare items do I have in total?", "What is the total number of courses I completed?",
                 "How much did I spend on bikes?", "how often do I run", "我一共去过几次日本？"):
        assert counts(text), text
    for text in ("How much was the budget?", "Which courses did I take?", "可以从几个方面来看。", "我的密码是多少？"):
        assert not counts(text), text


@given(st.text(alphabet=st.sampled_from(list("ab 12 three. 两只猫本书，。x$")), max_size=80))
def test_every_counted_term_is_a_term_of_the_text(text: str) -> None:
    own = set(tokenize(text))
    assert all(term.startswith(COUNTED) and term[len(COUNTED):] in own for term in counted_terms(text))
