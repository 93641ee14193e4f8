"""Text analysis for the lexical recall search (pure, standard library only).

Two entry points:

* ``tokenize(text)``: the terms the BM25 index stores and queries with.
  - Latin-script words are case-folded and lightly stemmed (plural, -ing, -ed, -ly, final -e, doubled
    consonants, final -y) so that "dance", "danced" and "dancing" meet on one term; single letters dropped.
  - Numbers are kept whole (``2024``, ``3``, ``3.5``), and so are words mixing letters and digits (``gpt4``).
  - CJK runs (Han, kana) are indexed without a dictionary as character unigrams plus overlapping
    bigrams; stop characters and stop bigrams are left out (hiragana unigrams are always left out:
    they are particles and inflections).
  - English and Chinese stop words are removed.
* ``keywords(text, top=6)``: seed 001's keyword extraction, the regex
  ``[a-z0-9_]{2,}|[\\u4e00-\\u9fff]{2,}`` (case-insensitive), stop words removed, the ``top`` most
  frequent (ties: first occurrence first).
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache
from itertools import filterfalse

__all__ = [
    "STOP_WORDS_EN",
    "STOP_WORDS_ZH",
    "KEYWORD_PATTERN",
    "CJK_CHAR",
    "tokenize",
    "tokens",
    "latin_term",
    "cjk_terms",
    "content_terms",
    "term_runs",
    "stem",
    "keywords",
    "keyword_counts",
    "top_keywords",
]

STOP_WORDS_EN: frozenset[str] = frozenset(
    """
    a about above after again against all almost also am an and any are aren't as at be because been before
    being below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't
    down during each either else even ever every few for from further get gets got had hadn't has hasn't
    have haven't having he he'd he'll he's her here here's hers herself him himself his how how's however i
    i'd i'll i'm i've if in into is isn't it it's its itself just let let's like ll me might more most much
    must mustn't my myself no nor not now of off oh ok okay on once only or other ought our ours ourselves out
    over own re really same shall shan't she she'd she'll she's should shouldn't so some such than that
    that's the their theirs them themselves then there there's these they they'd they'll they're they've
    this those though through to too under until up upon us very ve was wasn't we we'd we'll we're we've
    were weren't what what's when when's where where's whether which while who who's whom why why's will
    with won't would wouldn't yeah yes yet you you'd you'll you're you've your yours yourself yourselves
    """.split()
)

STOP_WORDS_ZH: frozenset[str] = frozenset(
    """
    的 了 着 过 是 在 和 与 及 或 也 就 都 而 并 但 又 还 很 太 更 最 把 被 让 给 对 从 向 往 于 以 为 之 其 这 那
    个 些 么 吗 呢 吧 啊 呀 哦 嗯 哈 啦 嘛 哪 我 你 您 他 她 它 们 有 没 不 要 会 能 可 得 地 么 啥 即 则 若 如 等
    我们 你们 他们 她们 它们 咱们 自己 什么 怎么 怎样 为什么 这个 那个 这些 那些 这样 那样 这里 那里 这么 那么 一个 一些
    一下 一点 没有 可以 因为 所以 但是 而且 如果 虽然 然后 还是 或者 就是 已经 的话 时候 现在 还有 不是 是不是 不会
    """.split()
)

KEYWORD_PATTERN = re.compile(r"[a-z0-9_]{2,}|[\u4e00-\u9fff]{2,}", re.IGNORECASE)
_STOP_WORDS = STOP_WORDS_EN | STOP_WORDS_ZH

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
CJK_CHAR = re.compile(rf"[{_CJK}]")  # a Chinese or Japanese character (the ranges tokenize reads as CJK)
_HIRAGANA = re.compile(r"[\u3040-\u309f]")
# A CJK run, a number with decimal/thousands separators inside, or a run of other letters and digits
# (with inner apostrophes).
_TOKEN_PATTERN = re.compile(rf"[{_CJK}]+|\d+(?:[.,]\d+)+|[^\W_{_CJK}]+(?:'[^\W_{_CJK}]+)*")
# _TOKEN_PATTERN on ASCII text (folded: lower case), where it finds the same tokens 1.4 times faster
_ASCII_TOKEN_PATTERN = re.compile(r"[0-9]+(?:[.,][0-9]+)+|[a-z0-9]+(?:'[a-z0-9]+)*")
_VOWELS = frozenset("aeiouy")
MAX_TOKENIZE_CHARS = 262_144
MAX_TERM_CHARS = 64
# marks the term of a word whose stem is a stop word but which is none ("theme" -> "them_"): no token holds "_"
STEMMED_INTO_STOP_WORD = "_"
_NO_UNDOUBLE = frozenset("lsz")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light, deterministic English suffix stripper (applied to index and query alike).

    It is not a linguistic stemmer; it only needs to map common inflections of one word to one key.
    """
    w = word
    if w.endswith("'s"):
        w = w[:-2]
    if len(w) <= 3:
        return w
    if w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    for suffix in ("ing", "ed", "ly"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and _VOWELS.intersection(w[: -len(suffix)]):
            w = w[: -len(suffix)]
            if len(w) > 3 and w[-1] == w[-2] and w[-1] not in _VOWELS and w[-1] not in _NO_UNDOUBLE:
                w = w[:-1]
            break
    if len(w) > 3 and w.endswith("e"):
        w = w[:-1]
    if len(w) > 2 and w.endswith("y") and w[-2] not in _VOWELS:
        w = w[:-1] + "i"
    return w


def cjk_terms(run: str) -> list[str]:
    """A CJK run's terms: its character unigrams and overlapping bigrams, stop characters and bigrams and hiragana
    unigrams left out."""
    terms: list[str] = []
    for i, char in enumerate(run):
        if char not in STOP_WORDS_ZH and not _HIRAGANA.match(char):
            terms.append(char)
        if i + 1 < len(run):
            pair = run[i : i + 2]
            if pair not in STOP_WORDS_ZH:
                terms.append(pair)
    return terms


# The words that name the kind of answer a question wants, not what it is about: the word after "how" ("how many",
# "how long"), "the total number of", "the amount of", "in total", and the time that has passed ("how many months have
# passed since…", "how many days passed between…"; not "which exam have I passed?")
ANSWER_KIND = re.compile(
    r"\bhow\s+(?:many|much|long|often|far|old|soon)\b"
    r"|\b(?:the\s+)?(?:total\s+)?(?:number|amount)\s+of\b|\bin\s+total\b|\btotal\b"
    r"|\b(?:days?|weeks?|months?|years?|hours?)\s+(?:(?:have|has|had)\s+)?(?:passed|elapsed|gone\s+by)\b(?:\s+since\b)?"
    r"|\b(?:passed|elapsed)\s+(?:since|between)\b", re.IGNORECASE)


def content_terms(text: str) -> list[str]:
    """``tokenize(text)`` without the words that name the kind of answer wanted (``ANSWER_KIND``), unless nothing else
    is left."""
    return tokenize(ANSWER_KIND.sub(" ", text)) or tokenize(text)


def tokenize(text: str) -> list[str]:
    """Search terms of ``text`` in order of appearance (duplicates kept: they are term frequencies).

    Bounded cost whatever a client sends: only the first ``MAX_TOKENIZE_CHARS`` characters are read (about
    0.3 s of CPU; a page or query longer than that is far beyond any context window), and a Latin-script
    term is at most ``MAX_TERM_CHARS`` long (a longer run of letters or digits is cut), which also bounds the
    ``stem`` memo in bytes."""
    folded = _folded(text)
    if folded.isascii():  # no CJK run: each token's term, memoised (the loop below without its per-token tests)
        cut = MAX_TERM_CHARS
        found = _ASCII_TOKEN_PATTERN.findall(folded)
        return [term for term in map(_term, [t if len(t) <= cut else t[:cut] for t in found]) if term is not None]
    terms: list[str] = []
    for token in _TOKEN_PATTERN.findall(folded):
        first = token[0]
        if "\u3040" <= first <= "\u30ff" or "\u3400" <= first <= "\u9fff" or "\uf900" <= first <= "\ufaff":
            terms.extend(cjk_terms(token))  # unigrams and bigrams: no term is long
            continue
        term = _term(token[:MAX_TERM_CHARS])  # latin_term inlined: tokenize runs over every page indexed
        if term is not None:
            terms.append(term)
    return terms


def tokens(text: str) -> list[str]:
    """The case-folded tokens of ``text`` that ``tokenize`` reads (its first ``MAX_TOKENIZE_CHARS`` characters): CJK runs,
    numbers, and runs of other letters and digits."""
    folded = _folded(text)
    return (_ASCII_TOKEN_PATTERN if folded.isascii() else _TOKEN_PATTERN).findall(folded)


def _folded(text: str) -> str:
    """What ``tokens`` and ``term_runs`` read of ``text``: its first ``MAX_TOKENIZE_CHARS`` characters, case-folded,
    the typographic apostrophe made plain."""
    return text[:MAX_TOKENIZE_CHARS].casefold().replace("\u2019", "'")


def latin_term(token: str) -> str | None:
    """The search term of a Latin-script or number token (``tokens``), None when it is a stop word; cut to
    ``MAX_TERM_CHARS``."""
    return _term(token[:MAX_TERM_CHARS])


@lru_cache(maxsize=65536)
def _term(token: str) -> str | None:
    """The term of a (cut) Latin-script or number token, None when it is none: memoised, as a chat repeats its words
    (the per-character digit test and the stemming ran for every occurrence)."""
    if token[0].isdigit() or any(char.isdigit() for char in token):  # numbers; identifiers such as v2, gpt4, h264
        return token
    if len(token) > 1 and token not in STOP_WORDS_EN:
        stemmed = stem(token)
        if stemmed not in STOP_WORDS_EN:
            return stemmed
        if not token.endswith("'s"):  # "theme", "notes", "evening" are not "them", "not", "even"
            return stemmed + STEMMED_INTO_STOP_WORD
    return None


_BETWEEN_RUN = re.compile(r"[\s-]*")


def term_runs(text: str, skip_after: str = "") -> list[list[str]]:
    """The Latin-script terms of ``text`` (as ``tokenize`` gives them) in runs of words with nothing but spaces or a
    hyphen between them: a stop word, a number's neighbour punctuation, any other punctuation or a Chinese or
    Japanese run ends a run. ``skip_after``: a word whose next word is left out (and ends the run)."""
    runs: list[list[str]] = [[]]
    end, previous = 0, ""
    lowered = _folded(text)
    for match in _TOKEN_PATTERN.finditer(lowered):
        token = match.group()
        cjk = CJK_CHAR.match(token) is not None
        term = None if cjk or previous == skip_after else latin_term(token)
        if term is None or not _BETWEEN_RUN.fullmatch(lowered, end, match.start()):
            if runs[-1]:
                runs.append([])
        if term is not None:
            runs[-1].append(term)
        end, previous = match.end(), token
    return [run for run in runs if run]


def keywords(text: str, top: int = 6) -> list[str]:
    """Seed 001's keywords: regex matches, lower-cased, stop words removed, ``top`` most frequent."""
    return top_keywords(keyword_counts(text), top) if top > 0 else []


def keyword_counts(text: str) -> Counter[str]:
    """The counts ``keywords`` ranks, in order of first appearance. Texts joined by a space count as the sum of their
    counts taken in that order (``Counter.update``): no keyword spans the space."""
    return Counter(filterfalse(_STOP_WORDS.__contains__, map(str.lower, KEYWORD_PATTERN.findall(text))))  # in C


def top_keywords(counts: Counter[str], top: int) -> list[str]:
    """The ``top`` most frequent of ``counts`` (ties: first appearance first, as Counter.most_common keeps it)."""
    return [word for word, _ in counts.most_common(top)] if top > 0 else []
