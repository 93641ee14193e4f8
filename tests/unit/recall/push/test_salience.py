"""memci_proxy.recall.push.salience: a message weighed against the archive, whatever its wording. Everyday look-ups in
English and Chinese match the page that answers them; chit-chat, a recurring theme and a lone coincidence do not; terms
the active pages hold add nothing; the cost does not grow with the archive."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.push.salience import (MAX_DF, MAX_TERMS, PAIR_DF, asks, counts, episodes, in_text,
                                              message_terms, phrase_pairs, specific_episodes, verdict, weigh)
from memci_proxy.recall.lexical.text import tokenize

FACTS = {
    "My gym locker code is PELICAN-8823.": ["What's my gym locker code?", "Can you tell me my gym locker code?"],
    "I graduated with a degree in marine biology.": ["What degree did I graduate with?"],
    "My daily commute to work takes 45 minutes by tram.": ["How long is my daily commute to work?"],
    "I'm reading The Left Hand of Darkness, a novel by Le Guin; the book is great.": ["Which book was I reading?"],
    "My dentist appointment is on March 14th.": ["When is my dentist appointment?"],
    "我的健身房储物柜密码是鹈鹕5531。": ["我的健身房储物柜密码是多少？"],
    "我对花生过敏，吃了会起荨麻疹。": ["我对什么东西过敏？"],
}
CHAT = ("We talked about the weather and the news today, number {n}. The model answer was long and the garden was "
        "green; people work and go home, time after time.")


def archive(extra: dict[int, str] | None = None, pages: int = 120) -> BM25Index:
    index = BM25Index()
    facts = list(FACTS)
    for n in range(1, pages + 1):
        text = CHAT.format(n=n)
        if n % 15 == 3 and (n // 15) < len(facts):
            text = "user: " + facts[n // 15] + "\nassistant: Noted. " + text
        index.add(str(n), (extra or {}).get(n, text))
    return index


def kind(text: str) -> str:
    return "question" if asks(text) else ""


def test_everyday_look_ups_match_the_page_that_answers_them() -> None:
    index = archive()
    facts = list(FACTS)
    for position, (fact, questions) in enumerate(FACTS.items()):
        for question in questions:
            w = weigh(index, question)
            assert verdict(w, kind(question)) == "pushed", (question, w)
            assert w.pages[0] == str(15 * position + 3), (question, w)
    assert facts  # the archive holds them


def test_chit_chat_a_coincidence_and_a_recurring_theme_do_not_push() -> None:
    index = archive()
    for text in ("What should I cook tonight?", "Tell me about the weather today.", "Thanks, that was helpful!",
                 "今天天气怎么样？"):
        assert verdict(weigh(index, text), kind(text)) != "pushed", text
    # a theme spread over the whole conversation is no look-up, however rare on each page
    spread = {n: CHAT.format(n=n) + " The sourdough starter again." for n in range(5, 120, 9)}
    assert verdict(weigh(archive(spread), "How is the sourdough starter?"), "question") != "pushed"


def test_what_the_active_pages_hold_adds_nothing() -> None:
    index = archive()
    question = "What's my gym locker code?"
    assert verdict(weigh(index, question), "question") == "pushed"
    active = "user: I went to the gym; the locker code is on a note.".casefold()
    assert verdict(weigh(index, question, in_text(active)), "question") != "pushed"


def test_a_statement_needs_more_than_a_question() -> None:
    index = archive()
    assert verdict(weigh(index, "Which book was I reading?"), "question") == "pushed"
    assert verdict(weigh(index, "I like books."), "") != "pushed"


def test_in_text_reads_inflections_not_longer_words() -> None:
    known = in_text("i started painting the stars; my history; 储物柜密码".casefold())
    assert known("paint") and known("star") and known("histori") and known("储物")
    assert not known("start" + "le") and not known("hous") and not known("pain")


_PIECES = st.sampled_from(["paint", "painted", "star", "start", "histor", "history", "histories", "y", "i", "s", "ed",
                            "_", "-", " ", "'s", "\n", "储物", "柜", "9", "é", "²", "plan", "planned", "n", "ing", "ly"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=30).map("".join), st.sampled_from(["paint", "star", "histori", "hi", "储物", "s9", "plan", "n"]))
def test_in_text_finds_what_its_pattern_finds(text: str, term: str) -> None:
    """The stem pre-scan is an optimisation only: the answer is the regular expression's over the whole text."""
    from memci_proxy.recall.push.salience import _term_pattern

    assert in_text(text)(term) == (_term_pattern(term).search(text) is not None)


def test_episodes_are_runs_of_nearby_pages() -> None:
    assert episodes([]) == 0
    assert episodes(["3", "4", "6", "6.2"]) == 1 and episodes(["3", "7"]) == 2
    assert episodes(["3", "40", "41", "90"]) == 3
    assert episodes(["a", "b"]) == 2
    assert specific_episodes(10) == 1 and specific_episodes(250) == 5


def test_question_detection_is_language_agnostic_enough() -> None:
    assert asks("What's my code?") and asks("我的密码是多少？") and asks("密码是多少") and asks("你记得吗")
    assert not asks("I like tea.") and not asks("好的，谢谢。")


def test_the_kind_of_answer_a_question_asks_for_names_nothing() -> None:
    assert message_terms("How many times did I go kayaking?") == tokenize("times go kayaking")
    assert message_terms("how long is my commute") == tokenize("commute")
    assert message_terms("how many?") == tokenize("many")  # nothing else: kept
    index = archive({30: "user: I went kayaking on the lake with Mira today.",
                     70: "user: Another kayaking trip, down the river with Jo."})
    # "many" or "often", words the archive never saw, no longer dilute the match
    assert weigh(index, "How many times did I go kayaking?").match == weigh(index, "Times I go kayaking?").match


def test_a_count_or_a_total_is_told_from_a_single_value() -> None:
    for text in ("How many times have I tried making a Negroni?", "How often do I go to yoga?",
                 "How much have I spent on coffee this month?", "What is the total number of courses I took?",
                 "How much did the trips cost in total?", "我一共去过几次？", "我买了几个杯子？"):
        assert counts(text), text
    for text in ("How much was the print budget?", "我的密码是多少？", "What's my gym locker code?", "给我几个建议。",
                 "这个问题可以从几个方面来看。能再详细讲讲预算吗？",  # 几个 is also "a few"
                 "Is a total eclipse visible here?", "How long is my commute?"):
        assert not counts(text), text


@settings(max_examples=30, deadline=None)
@given(st.integers(10, 250), st.text(max_size=300))
def test_the_cost_is_bounded_whatever_the_archive(pages: int, text: str) -> None:
    index = archive(pages=pages)
    reads = []
    original = index.documents_with

    def counting(term: str):
        docs = original(term)
        reads.append(len(docs))
        return docs

    index.documents_with = counting  # type: ignore[method-assign]
    w = weigh(index, text)
    assert sum(reads) <= len(message_terms(text)) * (MAX_DF + PAIR_DF)  # each term's, and once more as a pair's
    assert len(w.pages) <= 8 and 0.0 <= w.match <= 1.0 + 1e-9
    assert len(w.terms) <= MAX_TERMS


def test_a_short_number_alone_is_no_match_a_code_is() -> None:
    index = archive({40: "user: The parcel weighed 182 grams, the shop said.", 55: "user: The vault code is 88231."})
    assert verdict(weigh(index, "What about 182?"), "question") == "no_match"  # a chance number
    assert verdict(weigh(index, "What was 88231 again?"), "question") == "pushed"


def test_a_match_below_the_bar_of_a_question_still_gets_its_best_page() -> None:
    from memci_proxy.recall.push.salience import NARROW, STRENGTH, Weighing, one_page_idf

    def at(units: float, match: float) -> Weighing:
        return Weighing(100, units * one_page_idf(100), match)

    units, share = NARROW["question"][0]
    assert all(units < needed or share < least for needed, least in STRENGTH["question"])  # below the bar
    assert verdict(at(units, share), "question") == "narrow"
    assert verdict(at(units, share), "") == "weak"  # a statement never
    assert verdict(at(units - 0.1, share), "question") == "weak"
    assert verdict(at(2.0, 0.6), "question") == "pushed"


def test_phrase_pairs_are_adjacent_words_without_a_stop_word_or_punctuation_between() -> None:
    assert phrase_pairs("How many fitness classes do I attend in a typical week?") == [("fitness", "class"),
                                                                                       ("typical", "week")]
    assert phrase_pairs("My to-watch list, the new car.") == [("watch", "list"), ("new", "car")]
    assert phrase_pairs("Can you explain the quarterly budget?") == [("quarter", "budget")]
    assert phrase_pairs("我的健身课 fitness, classes") == []


def test_two_words_said_together_once_are_specific_together_a_phrasing_word_beside_a_subject_is_not() -> None:
    question = "Which fitness classes do I attend in a typical week?"
    # each word recurs all conversation long (in more episodes than a specific term may be), apart
    spread = {n: CHAT.format(n=n) + " Fitness matters to me." for n in range(5, 120, 19)}
    spread.update({n: CHAT.format(n=n) + " The class was full." for n in range(12, 120, 19)})
    assert verdict(weigh(archive(spread), question), "question") == "no_match"
    # a count spans sessions: what it counts may be met in more episodes
    assert verdict(weigh(archive(spread), "How many fitness classes do I attend?"), "question") != "no_match"
    # ... and together in one sitting: "fitness classes" is what that sitting was about
    spread.update({60: "user: I go to three fitness classes a week: spin, yoga and pilates.",
                   61: "user: The fitness classes are at the gym near my office, in the evening class slot."})
    w = weigh(archive(spread), question)
    assert verdict(w, "question") in ("pushed", "narrow") and set(w.pages[:2]) == {"60", "61"}, w
    assert {"fitness", "class"} <= set(w.terms)
    # a phrasing word beside a subject: each on many pages, together no more often than chance would have them
    chatty = {n: CHAT.format(n=n) + " Can you explain it again?" for n in range(2, 120, 4)}
    chatty.update({n: CHAT.format(n=n) + " The database indexes were slow." for n in range(3, 120, 10)})
    chatty.update({n: "user: Can you explain database indexes? " + CHAT.format(n=n) for n in (50, 51, 52)})
    assert verdict(weigh(archive(chatty), "Can you explain database indexes in more detail?"), "question") \
        == "no_match"
