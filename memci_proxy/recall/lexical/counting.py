"""Counts and what they count (pure): the words a number counts in what the user says, and the messages that ask
for a count or a total.

A question that asks for a count ("how many rare items do I have in total?", "what is the total number of online
courses I've completed?") is answered by the sittings where the user gave one: "I have 12 rare figurines",
"I've already completed 12 courses on Coursera". Many more pages name what it counts without a count: "can you
recommend some online courses?". BM25 alone cannot tell them apart.

* ``counted_terms(text)``: the terms of the words that follow a number, up to ``COUNTED_WORDS`` content words
  ("12 rare figurines" -> rare, figurines), prefixed with ``COUNTED``. A number is digits ("12", "3.5") or a number
  word ("twelve", "a dozen"); in Chinese, digits before a run of characters (25枚稀有硬币) or a numeral with a
  classifier (两只猫, 三本书). The index holds them beside the page's own terms
  (memci_proxy.recall.reading.pagetext.index_terms).
* ``counts(text)``: whether a message asks for a count or a total; its search weighs the counted form of each of
  its terms as much as the term (memci_proxy.recall.search.ranking.query_weights), so the pages that give a count of
  what it counts rank above those that only name it.
"""

from __future__ import annotations

import re

from memci_proxy.recall.lexical.text import CJK_CHAR, cjk_terms, latin_term, tokens

__all__ = ["COUNTED", "COUNTED_WORDS", "counted_terms", "counted_form", "counts"]

COUNTED = "#"  # prefix of a counted term (no search term holds "#": it is not a word character)
COUNTED_WORDS = 2  # content words after a number that it counts
_CJK_COUNTED_CHARS = 4  # characters after a Chinese number (and its classifier) whose terms it counts
_MAX_CHARS = 20_000  # of a message read for counted terms (a pasted document is not where a user counts their things)
# of a message read for ``counts`` (memci_proxy.recall.push.salience.MAX_CHARS: a message's head)
_QUESTION_CHARS = 2000

_NUMBER_WORDS = frozenset(
    """one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen
    eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred hundreds thousand thousands
    dozen dozens couple several""".split())
_CLASSIFIERS = "个只本次张件位种条台辆枚块瓶杯家门节场部首篇双套口头棵朵匹间座所支把颗份道集季"
_SENTENCE_END = re.compile(r"[.!?;:]+(?:\s|$)|[。！？；\n]+")  # (not the point of 3.5)
_CJK_NUMBER = re.compile(rf"(?:[一二两三四五六七八九十百千万几]+)[{_CLASSIFIERS}]")

# a count or a total: "how many", "how often", "in total", "the total amount", 一共, 几次 (not "how much was the
# budget", 密码是多少: one value, which the prompt answers when it names it)
_COUNT = re.compile(r"\bhow\s+(?:many|often)\b|\bhow\s+much\b[^?.!\n]{0,40}?\b(?:spen[dt]|paid|total)\b|\bin\s+total\b"
                    r"|\btotal\s+(?:number|amount|cost|money|of)\b|\baltogether\b"
                    # Chinese: in the clause a question mark ends (几个 is also "a few": 可以从几个方面来看。)
                    r"|(?:多少(?:次|个|种|回)|几(?:次|个|种|位|回)|一共|总共)[^。！!，,；;\n]{0,30}[？?]", re.IGNORECASE)


def counts(text: str) -> bool:
    """Whether the message asks for a count or a total ("how many times…", "how much did I spend in total", 几次,
    一共)."""
    return bool(_COUNT.search(text[:_QUESTION_CHARS]))


def counted_form(term: str) -> str:
    return COUNTED + term


def _is_number(token: str) -> bool:
    return token[0].isdigit() or token in _NUMBER_WORDS


def counted_terms(text: str) -> list[str]:
    """The counted terms of ``text`` (module docstring), in order of appearance: a number counts words of its own
    sentence only."""
    out: list[str] = []
    for sentence in _SENTENCE_END.split(text[:_MAX_CHARS]):
        out.extend(_counted(tokens(sentence)))
    return out


def _counted(found: list[str]) -> list[str]:
    out: list[str] = []
    for position, token in enumerate(found):
        if CJK_CHAR.match(token):
            numbers = list(_CJK_NUMBER.finditer(token))
            for number, following in zip(numbers, [*(n.start() for n in numbers[1:]), len(token)]):
                counted = token[number.end():min(following, number.end() + _CJK_COUNTED_CHARS)]
                out.extend(map(counted_form, cjk_terms(counted)))
            continue
        if not _is_number(token):
            continue
        words = 0
        for after in found[position + 1:position + 1 + 2 * COUNTED_WORDS + 2]:
            if CJK_CHAR.match(after):
                if token[0].isdigit() and words == 0:  # 25枚稀有硬币: the classifier, then what it counts
                    run = after[1:] if after[0] in _CLASSIFIERS else after
                    out.extend(map(counted_form, cjk_terms(run[:_CJK_COUNTED_CHARS])))
                break
            if _is_number(after):
                break
            term = latin_term(after)
            if term is None:  # a stop word
                continue
            out.append(counted_form(term))
            words += 1
            if words >= COUNTED_WORDS:
                break
    return out
