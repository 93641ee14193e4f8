"""Tokenizer and seed-001 keyword extraction."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.recall.lexical.text import STOP_WORDS_EN, STOP_WORDS_ZH, keywords, stem, tokenize


def test_english_words_are_lowercased_stemmed_and_stop_words_dropped() -> None:
    terms = tokenize("The Dancers were DANCING at the parties, and she danced!")
    assert terms == ["dancer", "danc", "parti", "danc"]


def test_inflections_of_one_word_meet_on_one_term() -> None:
    groups = (["dance", "danced", "dancing", "dances"], ["study", "studies", "studied"], ["run", "running", "runs"])
    for group in groups:
        assert len({stem(word) for word in group}) == 1, group


def test_numbers_are_kept_whole_and_single_letters_dropped() -> None:
    assert tokenize("page 3 of 12, version 2.5 - a b c") == [stem("page"), "3", "12", "version", "2.5"]


def test_curly_apostrophe_is_handled_like_straight() -> None:
    assert tokenize("Bart’s kite") == tokenize("Bart's kite") == ["bart", "kit"]


def test_chinese_runs_give_unigrams_and_bigrams_without_stop_words() -> None:
    terms = tokenize("我喜欢北京")
    assert "北京" in terms and "喜欢" in terms and "北" in terms and "京" in terms
    assert "我" not in terms  # a stop character on its own
    assert "我们" not in tokenize("我们喜欢")  # a stop bigram


def test_chinese_query_matches_a_longer_chinese_text() -> None:
    document = set(tokenize("上次部署使用了 Cloudflare Workers，遇到了超时问题"))
    query = tokenize("部署超时")
    assert {"部署", "超时"} <= document
    assert {"部署", "超时"} <= set(query)


def test_mixed_text_keeps_both_scripts() -> None:
    terms = tokenize("Deploy 到 Cloudflare 时遇到超时 timeout")
    assert "deploy" in terms and "timeout" in terms and "超时" in terms and "cloudflar" in terms


def test_japanese_kana_particles_are_not_unigrams() -> None:
    terms = tokenize("東京でラーメン")
    assert "東京" in terms and "で" not in terms


def test_empty_and_punctuation_only_texts_have_no_terms() -> None:
    assert tokenize("") == []
    assert tokenize("... !!! ，。？") == []


@given(st.text(max_size=200))
def test_tokenize_never_yields_stop_words_or_empty_terms(text: str) -> None:
    for term in tokenize(text):
        assert term
        assert term not in STOP_WORDS_EN
        assert not (len(term) == 1 and term in STOP_WORDS_ZH)


def test_keywords_follow_seed_001() -> None:
    text = "用户偏好使用 pnpm 而非 npm。pnpm install; the Workers and workers of Cloudflare"
    # seed regex: Latin [a-z0-9_]{2,} and CJK runs of 2+, case-insensitive, stop words removed, by frequency
    assert keywords(text, top=3) == ["pnpm", "workers", "用户偏好使用"]
    assert keywords(text, top=6) == ["pnpm", "workers", "用户偏好使用", "而非", "npm", "install"]


def test_keywords_respect_top_and_drop_single_characters() -> None:
    assert keywords("a b c x1 x1 我 好", top=6) == ["x1"]
    assert keywords("alpha beta", top=0) == []


def _tokenize_unmemoised(text: str) -> list[str]:
    """The tokenizer spelled out token by token (what the memoised one must equal)."""
    from memci_proxy.recall.lexical.text import _TOKEN_PATTERN, MAX_TERM_CHARS, MAX_TOKENIZE_CHARS, cjk_terms

    terms: list[str] = []
    for match in _TOKEN_PATTERN.finditer(text[:MAX_TOKENIZE_CHARS].casefold().replace("\u2019", "'")):
        token = match.group()
        first = token[0]
        if "\u3040" <= first <= "\u30ff" or "\u3400" <= first <= "\u9fff" or "\uf900" <= first <= "\ufaff":
            terms.extend(cjk_terms(token))
            continue
        token = token[:MAX_TERM_CHARS]
        if first.isdigit() or any(char.isdigit() for char in token):
            terms.append(token)
        elif len(token) > 1 and token not in STOP_WORDS_EN and stem(token) not in STOP_WORDS_EN:
            terms.append(stem(token))
    return terms


@given(st.text(alphabet=st.sampled_from("ab yesing's 2٣²x.,'’ÉßİŉǅⅫ天気のはé\u0301-_") | st.characters(), max_size=120))
def test_the_memoised_tokenizer_gives_the_terms_of_the_plain_one(text: str) -> None:
    assert tokenize(text) == _tokenize_unmemoised(text) == tokenize(text)


@given(st.lists(st.text(alphabet=st.sampled_from("ab cd_ 12 the 天气 好的 AB\n"), max_size=40), max_size=5),
       st.integers(0, 8))
def test_keywords_of_joined_texts_are_the_top_of_their_summed_counts(texts: list[str], top: int) -> None:
    from memci_proxy.recall.lexical.text import keyword_counts, top_keywords

    summed = keyword_counts("")
    for text in texts:
        summed.update(keyword_counts(text))
    assert top_keywords(summed, top) == keywords(" ".join(texts), top)


@given(st.text(alphabet=st.sampled_from("ab cd_ 12 the 天气 好的 的 AB KſİßÉ\n.,") | st.characters(), max_size=120))
def test_keyword_counts_are_the_regex_matches_lowered_without_stop_words_in_order(text: str) -> None:
    from memci_proxy.recall.lexical.text import KEYWORD_PATTERN, keyword_counts

    expected: dict[str, int] = {}
    for match in KEYWORD_PATTERN.finditer(text):
        word = match.group().lower()
        if word not in STOP_WORDS_EN and word not in STOP_WORDS_ZH:
            expected[word] = expected.get(word, 0) + 1
    counts = keyword_counts(text)
    assert dict(counts) == expected and list(counts) == list(expected)


def test_a_word_whose_stem_is_a_stop_word_is_still_a_term() -> None:
    # "theme" -> "them", "notes" -> "not", "evening" -> "even": the stem of each is a stop word, the word is none
    for word in ("theme", "themes", "notes", "evening", "willing", "outing"):
        (term,) = tokenize(word)
        assert term not in STOP_WORDS_EN
    assert tokenize("theme") == tokenize("themes") == tokenize("themed")
    assert tokenize("note") == tokenize("notes")
    assert tokenize("them not even") == []  # the stop words themselves stay out
    assert tokenize("the cat's a's toy") == tokenize("cat toy")


def _tokenize_reference(text: str) -> list[str]:
    """tokenize as it was before its ASCII path: every token through the general pattern and per-token tests."""
    from memci_proxy.recall.lexical.text import _TOKEN_PATTERN, MAX_TERM_CHARS, _folded, _term, cjk_terms

    terms: list[str] = []
    for token in _TOKEN_PATTERN.findall(_folded(text)):
        first = token[0]
        if "\u3040" <= first <= "\u30ff" or "\u3400" <= first <= "\u9fff" or "\uf900" <= first <= "\ufaff":
            terms.extend(cjk_terms(token))
            continue
        term = _term(token[:MAX_TERM_CHARS])
        if term is not None:
            terms.append(term)
    return terms


_WORDISH = st.lists(st.sampled_from(list("abcXYZ019 .,'-_\n\t") + ["it's", "3.5", "1,000", "x" * 70, "Running", "cafés",
                                                                    "東京", "ひら", "the", "notes"]),
                    max_size=30).map("".join)


@given(st.one_of(_WORDISH, st.text(max_size=60), st.text(alphabet=st.characters(max_codepoint=127), max_size=80)))
def test_tokens_and_terms_are_those_of_the_general_pattern(text: str) -> None:
    from memci_proxy.recall.lexical.text import _TOKEN_PATTERN, _folded, tokens

    assert tokens(text) == _TOKEN_PATTERN.findall(_folded(text))  # ASCII text: the faster pattern, the same tokens
    assert tokenize(text) == _tokenize_reference(text)
