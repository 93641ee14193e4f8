"""Memory across a user's conversations, the pure part: terms, labels, ranking, rendering."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.recall.users import across
from memci_proxy.store.ports import UserPageStats, UserPageText
from memci_proxy.turn.across import user_turns


def page(cid: str, number: str, text: str, seen: float = 0.0) -> UserPageText:
    return UserPageText(cid, number, seen, text)


def ranked(question: str, pages: list[UserPageText], k: int) -> tuple[list[tuple[UserPageText, float]], dict]:
    """across.rank over the pages' stored statistics (as the store gives them), mapped back to the pages."""
    query = across.query_of(question)
    stats = []
    for p in pages:
        counts, length = across.page_counts(p.text)
        stats.append(UserPageStats(p.conversation_id, p.number, p.seen_at, length,
                                   {t: counts[t] for t in query.weights if t in counts}))
    hits, idf = across.rank(query, stats, k)
    by_key = {(p.conversation_id, p.number): p for p in pages}
    return [(by_key[(s.conversation_id, s.number)], score) for s, score in hits], idf


def test_terms_carry_the_users_key_once_each():
    counts, length = across.page_counts("user: my guitar, my guitar and my piano\nassistant: a piano")
    terms = across.tagged_terms("uabc", counts)
    assert terms == [f"uabc.{t}" for t in dict.fromkeys(across.tokenize("my guitar, my guitar and my piano"))]
    assert "uabc.user" not in terms and "uabc.assistant" not in terms  # the role labels are not terms
    assert counts[across.tokenize("piano")[0]] == 3 and length == sum(counts.values())  # the user's words twice


def test_the_tsquery_quotes_each_lexeme():
    assert across.tsquery_text("u1", ["it's", "a\\b"]) == "'u1.it''s' | 'u1.a\\\\b'"


@given(st.from_regex(r"c[0-9a-f]{24}", fullmatch=True), st.from_regex(r"[1-9][0-9]{0,3}(\.[2-9])?", fullmatch=True))
def test_a_label_names_its_conversation_and_page(cid, number):
    label = across.page_label(cid, number)
    prefix, parsed = across.parse_label(label)
    assert cid.startswith(prefix) and parsed == number


def test_labels_of_this_conversation_are_not_other_conversations_labels():
    for label in ("3", "12.2", "c12/3x", "/3", "C0ffee12/3"):
        assert across.parse_label(label) is None


def test_a_hit_holds_two_of_the_querys_terms():
    pages = [page("c1", "1", "user: I keep my guitar at home."),
             page("c1", "2", "user: The guitar was serviced at the shop on Main St."),
             page("c2", "3", "user: the shop sells bread.")]
    hits, idf = ranked("where did I get my guitar serviced?", pages, 5)
    assert [h[0].number for h in hits] == ["2"]
    assert idf["guitar"] < idf["servic"]  # two candidates hold it, one the other


def test_the_users_own_words_weigh_more_than_the_answers():
    user_said = page("c1", "1", "user: my tortoise is called Rex\nassistant: nice")
    assistant_said = page("c1", "2", "user: hi\nassistant: tortoise called Rex tortoise called Rex are fine names")
    counts, _ = across.page_counts(user_said.text)
    assert counts.get("tortois") == 2 or counts.get("tortoise") == 2
    hits, _ = ranked("what is my tortoise called?", [assistant_said, user_said], 2)
    assert hits[0][0] is user_said


def test_the_round_shows_newest_first_with_labels_and_dates():
    old = page("c0000000aaaa", "2", "user: my locker code is 4417", seen=0.0)
    new = page("c1111111bbbb", "5", "user: my new locker code is 5520", seen=86_400.0 * 400)
    hits, idf = ranked("what is my locker code?", [old, new], 5)
    text = across.render("locker code", hits, idf, 320)
    assert text.index("[Page c1111111b/5] 1971-02-05") < text.index("[Page c0000000a/2] 1970-01-01")
    assert "4417" in text and "5520" in text


def test_pages_already_pushed_are_known_from_the_kept_rounds():
    tool = {"role": "tool", "content": "Pages …:\n[Page c1234abcd/3] 2024-01-01, another conversation: …\n[Page 7] x"}
    state = SimpleNamespace(hidden=[SimpleNamespace(messages=[{"role": "assistant", "content": None}, tool])])
    assert across.shown_labels(state) == {"c1234abcd/3"}
    assert across.shown_labels(None) == set()


def test_a_turn_is_indexed_whole_with_its_continuation_pages():
    pages = [SimpleNamespace(label="1", start=0, end=2, first_seen=1.0),
             SimpleNamespace(label="2", start=2, end=3, first_seen=2.0),
             SimpleNamespace(label="2.2", start=3, end=4, first_seen=2.0),
             SimpleNamespace(label="2.3", start=4, end=6, first_seen=2.0),
             SimpleNamespace(label="3", start=6, end=8, first_seen=3.0)]
    assert [(t.label, t.start, t.end) for t in user_turns(pages)] == [("1", 0, 2), ("2", 2, 6), ("3", 6, 8)]


def test_a_push_needs_a_term_that_names_something_specific():
    # the user's every chat is the same template: its words are on every page and name nothing
    pages = [page("c1", str(n), f"user: What about item {n}? Please keep it brief and concrete.") for n in range(40)]
    query = "What about item 7? Please keep it brief and concrete."
    assert ranked(query, pages, 6)[0]  # an explicit search still ranks them ...
    stats = []
    q = across.query_of(query)
    for p in pages:
        counts, length = across.page_counts(p.text)
        stats.append(UserPageStats(p.conversation_id, p.number, p.seen_at, length,
                                   {t: counts[t] for t in q.weights if t in counts}))
    assert across.rank(q, stats, 6, across.specific_limit(40))[0] == []  # ... a push finds nothing specific
    guitar = page("c2", "1", "user: My guitar was serviced at the shop on Main St, please remember.")
    counts, length = across.page_counts(guitar.text)
    q = across.query_of("Where did I get my guitar serviced, please?")
    stats.append(UserPageStats("c2", "1", 0.0, length, {t: counts[t] for t in q.weights if t in counts}))
    hits, _ = across.rank(q, stats, 6, across.specific_limit(41))
    assert [h[0].conversation_id for h in hits] == ["c2"]


def test_terms_common_among_the_users_pages_are_remembered_and_not_searched_again():
    import asyncio

    from memci_proxy.recall.users.search import search_user

    class Store:
        calls = 0

        async def user_page_candidates(self, tenant, end_user, cid, tsquery, counted, limit):
            Store.calls += 1
            return [UserPageStats("c1", str(n), 0.0, 12, {t: 1 for t in counted}) for n in range(40)]

        async def user_page_texts(self, tenant, end_user, pages):
            return []

    common: set[str] = set()
    hits, _ = asyncio.run(search_user(Store(), "t", "u1", "c2", "What about item 7? Keep it brief.", 6,
                                      user_pages=40, common=common))
    assert hits == [] and {"item", "brief", "keep"} <= common


def test_a_turn_notes_the_pages_of_its_tail_only():
    """The user turns reaching past the turn's first new entry, continuation pages included, read from the end."""
    from memci_proxy.engine.state import PageRecord
    from memci_proxy.turn.across import tail_pages, user_turns

    pages = [PageRecord(1, 1, 0, 2, 10), PageRecord(2, 1, 2, 4, 10), PageRecord(2, 2, 4, 6, 10),
             PageRecord(3, 1, 6, 8, 10)]
    for first_new in range(0, 9):
        expected = [t for t in user_turns(pages) if t.end > first_new]
        assert [t for t in user_turns(tail_pages(pages, first_new)) if t.end > first_new] == expected
    assert tail_pages(pages, 5) == pages[1:]  # page 2.2 reaches past 5: page 2 with it
    assert tail_pages(pages, 8) == []


_PAGE_TEXT = st.lists(st.sampled_from(["user: ", "\nassistant: ", "\ntool: ", "I have 3 cats", " and 12 plants", " the",
                                       " guitar", " Rex's", " 東京に2匹", " 2.5 kg", ".", " walked", "\n"]),
                      max_size=25).map("".join)


def _page_terms_reference(text: str, user_weight: int = across.USER_WEIGHT) -> list[str]:
    """A page's terms as the proxy listed them before it counted them directly: the user's words repeated
    ``user_weight`` times, with their counted terms; the others' words once."""
    from memci_proxy.recall.lexical.counting import counted_terms
    from memci_proxy.recall.lexical.text import tokenize

    terms: list[str] = []
    for role, said in across._segments(text):
        words = tokenize(said)
        terms.extend(words * user_weight if role == "user" else words)
        if role == "user":
            terms.extend(counted_terms(said))
    return terms


@given(_PAGE_TEXT)
def test_page_counts_are_those_of_the_pages_terms_in_their_order(text: str) -> None:
    from collections import Counter

    terms = _page_terms_reference(text)
    counts, length = across.page_counts(text)
    assert list(counts.items()) == list(Counter(terms).items()) and length == len(terms)
