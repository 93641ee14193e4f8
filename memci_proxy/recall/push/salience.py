"""What a user message needs from the archive, whatever its wording (pure, no I/O).

The push (memci_proxy.turn.push) asks this module on every user turn, so it must be cheap and must not grow with the
history:

* ``message_terms(text)``: the message's search terms (memci_proxy.recall.lexical.text.tokenize: stop words out, English
  lightly stemmed, Chinese and Japanese as characters and character pairs), each once, from its first ``MAX_CHARS``.
* ``weigh(index, text, known)``: the terms looked up in the conversation's BM25 index of archived pages. A term is
  *specific* when the pages holding it are few (``PAGE_SHARE`` of the archive, at most ``MAX_DF``) and lie in few
  episodes (runs of nearby pages, ``specific_episodes``): a fact said once, a subject talked over in one sitting,
  not a theme that recurs all conversation long; a character pair only beside a specific character. Candidate pages
  hold a specific term the active pages lack (``known``, from ``in_text``); the best candidate's *match* is the idf
  of the message's terms it holds, as a share of the message's ``MATCH_TERMS`` rarest; its *strength* the
  episode-idf of its specific terms, in units of a term held by one page (``one_page_idf``). Only the postings of
  terms held by few pages are read: at most ``MAX_TERMS * MAX_DF`` page ids however long the conversation.
* ``verdict(weighing, asking)``: push when the best page reaches one of the (strength, match) pairs of
  ``STRENGTH`` for the kind of message: a statement needs more than a question (``asks``: a question mark, or a
  Chinese interrogative), a question more than a look-up phrase (memci_proxy.recall.push.proactive.is_look_up). The
  phrasing lowers the bar; it never replaces the archive's match.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from memci_proxy.engine.memo import memoised
from memci_proxy.recall.lexical.bm25 import BM25Index, DocId
from memci_proxy.recall.lexical.counting import counts
from memci_proxy.recall.lexical.text import content_terms, term_runs

__all__ = ["MAX_CHARS", "NOTHING", "NARROW", "STRENGTH", "Weighing", "asks", "counts", "in_text", "never_known", "message_terms", "episodes", "one_page_idf", "phrase_pairs", "specific_episodes", "verdict",
           "weigh"]

MAX_CHARS = 2000  # a message is weighed by its head: a pasted document is not a question about the archive
MAX_TERMS = 24  # specific terms weighed per message, the rarest first
# A term is specific when the archived pages holding it lie in few episodes (a fact said once, a subject talked
# over in one sitting), not spread over the conversation (a recurring theme, a word of every day):
SPECIFIC_SHARE = 0.02  # at most this many episodes per archived page ...
MIN_EPISODES = 1  # ... or this many, in a small archive ...
EPISODE_GAP = 3  # (pages at most this far apart are one episode)
COUNT_EPISODES = 3  # ... times as many for a message that asks for a count or a total (``counts``)
PAGE_SHARE = 0.1  # ... and held by at most this share of the pages (or MIN_DF) ...
MIN_DF = 4
MAX_DF = 32  # ... and never by more: the postings a turn reads stay bounded
MATCH_TERMS = 12  # the match is a share of the idf of the message's rarest terms (a long message is not diluted)
UNSEEN_WEIGHT = 0.5
SHORT_NUMBER_DIGITS = 3  # a number of at most this many digits is not specific by itself
# Two adjacent words of the message ("fitness classes", "coding exercises") are specific together when the pages
# holding both are few, in few episodes, and hold them together at least PAIR_LIFT times as often as chance would
# (a compound, not a phrasing word beside a subject: "explain" and "database" meet only where the user asked to
# explain databases); each word on at most PAIR_DF pages, so that the postings a turn reads stay bounded
PAIR_DF = 64
PAIR_LIFT = 2.0
PAGES = 8  # best pages kept (their matched terms are checked against the active pages)
# By kind of message, the (strength in one-page idfs, share of what the message names) an archived page must reach,
# either pair: a few rare terms that cover most of the message, or more rare terms that cover less of it
STRENGTH = {
    "": ((3.0, 0.6),),  # a statement: three rare terms of one page, most of what the message names
    "question": ((0.6, 0.5), (1.5, 0.3)),
    "look_up": ((0.5, 0.3),),  # a look-up phrase ("remind me", "what did I tell you about")
}

# Below those, the pairs at which a question (or a look-up phrase) is still pushed, but only where the prompt has
# room (no epoch brought forward for it): a rare term of the message held in a few episodes (a subject met more
# than once) answers a question often enough to be worth a round
NARROW = {
    "": (),
    "question": ((0.7, 0.2),),
    "look_up": ((0.5, 0.1),),
}

_QUESTION = re.compile(r"[?？]|[吗呢么]\s*[。！!]?\s*$|(?:什么|多少|几[个次天年月号点岁]|哪|谁|怎么|为什么|是否)")


def message_terms(text: str) -> list[str]:
    """The message's search terms, each once, in order of appearance; not the words that name the kind of answer
    wanted ("how many times did I go kayaking?" names kayaking and times, not many;
    memci_proxy.recall.lexical.text.ANSWER_KIND), as the search leaves them out."""
    return list(dict.fromkeys(content_terms(text[:MAX_CHARS])))


def asks(text: str) -> bool:
    """Whether the message asks something (a question mark, full-width too, or a Chinese interrogative)."""
    return bool(_QUESTION.search(text[:MAX_CHARS]))


def never_known(term: str) -> bool:
    """``known`` for ``weigh`` when what the active pages hold answers only part of the message (``counts``)."""
    return False


def specific_episodes(pages: int) -> int:
    """Most episodes a specific term may be held in, in an archive of ``pages`` pages."""
    return max(MIN_EPISODES, math.ceil(SPECIFIC_SHARE * pages))


def episodes(docs: list[DocId]) -> int:
    """In how many episodes of the conversation these pages lie: runs of pages at most ``EPISODE_GAP`` apart (page
    labels are numbers, "12" or "12.2"; an id that is not is an episode of its own)."""
    numbers: list[int] = []
    alone = 0
    for doc in docs:
        head = str(doc).partition(".")[0]
        if head.isdigit():
            numbers.append(int(head))
        else:
            alone += 1
    numbers.sort()
    runs = 1 + sum(1 for a, b in zip(numbers, numbers[1:]) if b - a > EPISODE_GAP) if numbers else 0
    return runs + alone


def one_page_idf(pages: int) -> float:
    """The idf of a term held by one page of ``pages`` (the unit of strength)."""
    return math.log(1.0 + (pages - 0.5) / 1.5) if pages > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Weighing:
    archived: int  # pages in the index
    strength: float  # idf of the specific terms the best page holds (0: none)
    match: float  # the best page's share of the message's specific idf
    pages: tuple[DocId, ...] = ()  # pages holding specific terms, best first (at most PAGES)
    terms: tuple[str, ...] = ()  # specific terms those pages hold, rarest first
    held: frozenset[str] = frozenset()  # the message's rarest terms the best page holds (the push's query)
    # pages (as labels) holding a term of the message that few pages hold (at most the specific terms' page count,
    # episodes aside: a subject met in several sessions), ``pages`` among them; filled when weighed with ``known``
    # (the weighing a push acts on)
    holding: frozenset[str] = frozenset()

    @property
    def units(self) -> float:
        """Strength in one-page idfs."""
        unit = one_page_idf(self.archived)
        return self.strength / unit if unit > 0 else 0.0


NOTHING = Weighing(0, 0.0, 0.0)


def weigh(index: BM25Index, text: str, known: Callable[[str], bool] | None = None) -> Weighing:
    """The message's terms against the archived pages (``index``). ``known(term)``: the term is in the active pages
    already (what a page holds of it adds nothing the prompt lacks). Candidate pages are those holding a specific
    term the active pages lack; each candidate's match is the idf of every term of the message it holds. Cost: the
    message's terms (dictionary look-ups), at most ``MAX_TERMS * MAX_DF`` postings, ``PAGES`` candidates."""
    archived = len(index)
    if archived == 0 or not text:
        return NOTHING
    # a count spans sessions ("how many fitness classes do I attend?"): what it counts may be met in more episodes
    cap = specific_episodes(archived) * (COUNT_EPISODES if counts(text) else 1)
    max_df = min(MAX_DF, max(MIN_DF, math.ceil(PAGE_SHARE * archived)))
    terms = message_terms(text)
    idf: dict[str, float] = {}
    found: dict[str, tuple[int, list[DocId]]] = {}  # term -> (episodes, pages), for terms on few pages
    for term in terms:
        df = index.document_frequency(term)
        if df == 0 and _pair(term):
            continue  # an unseen character pair is mostly two words side by side, not a new word
        # a term the archive never saw counts as half the rarest: the message names something the pages do not
        # (or words they happen not to use: phrasing, in a short conversation)
        idf[term] = _idf(archived, df) * (1.0 if df else UNSEEN_WEIGHT)
        if 0 < df <= max_df:
            docs = index.documents_with(term)
            found[term] = (episodes(docs), docs)
    # a character pair is specific only if one of its characters is (two common characters side by side are mostly
    # the end of one word and the start of the next)
    # a short number is never specific by itself: a thousand values, met by chance in any long conversation (a
    # quantity, a time, a price); it still counts in what the message names
    rare = {t for t, (runs, _) in found.items() if runs <= cap and not _short_number(t)}
    specific: list[tuple[float, str, list[DocId]]] = []  # (idf over episodes, term, its pages)
    for term in sorted(rare):
        if _pair(term) and rare.isdisjoint(term):
            continue
        runs, docs = found[term]
        # a Chinese or Japanese word is indexed as its characters and their pairs: half each
        specific.append((_idf(archived, runs) * (0.5 if _cjk(term) else 1.0), term, docs))
    pairs = _specific_pairs(index, text, rare, archived, max_df, cap)
    specific.extend((_idf(archived, episodes(docs)), pair, docs) for pair, docs in pairs.items())
    named = heapq.nlargest(MATCH_TERMS, idf, key=idf.__getitem__)  # what the message names most, however long
    total = math.fsum(idf[t] for t in named)
    specific.sort(key=lambda item: (-item[0], item[1]))
    del specific[MAX_TERMS:]
    scores: dict[DocId, float] = {}
    for weight, term, docs in specific:
        if known is not None and all(known(word) for word in term.split(" ")):  # (a pair: both known)
            continue
        for doc in docs:
            scores[doc] = scores.get(doc, 0.0) + weight
    if not scores or total <= 0:
        return Weighing(archived, 0.0, 0.0)
    lacking = [t for t in named if known is None or not known(t)]
    candidates = heapq.nlargest(PAGES, scores, key=scores.__getitem__)
    covered = {doc: math.fsum(idf[t] for t in lacking if index.holds(doc, t)) for doc in candidates}
    ranked = sorted(candidates, key=lambda d: (-covered[d], -scores[d]))
    best = ranked[0]
    held = {t for _, t, _ in specific for d in ranked if (d in pairs[t] if t in pairs else index.holds(d, t))}
    matched = tuple(dict.fromkeys(word for _, t, _ in specific if t in held for word in t.split(" ")))
    holding = frozenset() if known is None else frozenset(
        str(doc) for term, (_, docs) in found.items() if not _short_number(term) for doc in docs) | frozenset(
        str(doc) for docs in pairs.values() for doc in docs)
    return Weighing(archived, scores[best], covered[best] / total, tuple(ranked), matched,
                    frozenset(t for t in lacking if index.holds(best, t)), holding)


def _specific_pairs(index: BM25Index, text: str, rare: set[str], archived: int, max_df: int, cap: int
                    ) -> dict[str, list[DocId]]:
    """"a b" -> the pages holding both, for the adjacent words of the message that are specific together (not
    alone: a word specific by itself counts by itself). Postings read: each word's at most once, at most PAIR_DF."""
    read: dict[str, set[DocId]] = {}

    def pages_of(term: str) -> set[DocId] | None:
        if term not in read:
            df = index.document_frequency(term)
            read[term] = set(index.documents_with(term)) if 0 < df <= PAIR_DF else set()
        return read[term] or None

    out: dict[str, list[DocId]] = {}
    for a, b in phrase_pairs(text):
        if a in rare or b in rare or _short_number(a) or _short_number(b):
            continue
        first, second = pages_of(a), pages_of(b)
        if first is None or second is None:
            continue
        both = first & second
        if not both or len(both) > max_df or len(both) * archived < PAIR_LIFT * len(first) * len(second):
            continue
        docs = sorted(both, key=str)
        if episodes(docs) <= cap:
            out[f"{a} {b}"] = docs
    return out


def phrase_pairs(text: str) -> list[tuple[str, str]]:
    """The message's adjacent Latin-script terms, nothing but spaces or a hyphen between them ("fitness classes",
    "to-watch list"), each pair once; a stop word or punctuation breaks the run, and the word after "how" (the
    kind of answer wanted: "how many") is left out."""
    out: list[tuple[str, str]] = []
    for run in term_runs(text[:MAX_CHARS], skip_after="how"):
        for pair in zip(run, run[1:]):
            if pair[0] != pair[1] and pair not in out:
                out.append(pair)
    return out


_CJK_PAIR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]{2}")


def _pair(term: str) -> bool:
    return len(term) == 2 and _CJK_PAIR.fullmatch(term) is not None


def _short_number(term: str) -> bool:
    return len(term) <= SHORT_NUMBER_DIGITS and term.isascii() and term.isdigit()


def _cjk(term: str) -> bool:
    return _CJK_PAIR.match(term + term[:1]) is not None


def _idf(total: int, count: int) -> float:
    return math.log(1.0 + (total - count + 0.5) / (count + 0.5))


def in_text(lowered: str) -> Callable[[str], bool]:
    """``known`` for ``weigh``: whether a search term occurs in ``lowered`` (the active pages' text, case-folded),
    by the rule of ``_term_pattern`` (a scan for the term's stem, then string comparisons where it occurs; no
    tokenizing of the window). An English stem stands for its
    inflections ("paint": paints, painted, painting; "histori": history, histories), not for longer words ("star"
    is not "start"); a Chinese or Japanese term is a plain substring."""

    def known(term: str) -> bool:
        if _cjk(term):
            return term in lowered
        # Every match starts with the term's literal stem: the text is scanned for it in C (a rare term, absent from
        # the window, costs one fast search instead of a regular-expression pass over every position), and the
        # pattern is tried only where the stem occurs.
        stem = _stem(term)
        at = lowered.find(stem)
        while at >= 0:
            if _inflection_at(lowered, at, term, stem):
                return True
            at = lowered.find(stem, at + 1)
        return False

    return known


_SUFFIXES = ("", "e", "s", "es", "ed", "d", "ing", "ly", "'s")


def _stem(term: str) -> str:
    """The literal every match of ``_term_pattern(term)`` starts with."""
    return term[:-1] if term.endswith("i") and len(term) > 2 else term


def _letter_or_digit(text: str, at: int) -> bool:
    """Whether ``text[at]`` is a word character other than the underscore (``[^\\W_]``); False past either end."""
    return 0 <= at < len(text) and text[at].isalnum()


def _inflection_at(text: str, at: int, term: str, stem: str) -> bool:
    """Whether ``_term_pattern(term)`` (a Latin-script term) matches ``text`` at ``at``, where ``stem`` occurs: the
    same test by string comparisons (compiling a pattern per term cost more than the searches it saved)."""
    if _letter_or_digit(text, at - 1):
        return False
    end = at + len(stem)
    if len(stem) != len(term):  # a stem ending in "i": "i" or "y" follows ("histori": history)
        if end >= len(text) or text[end] not in "iy":
            return False
        end += 1
    ends = (end + 1, end) if text.startswith(term[-1], end) else (end,)  # the last letter doubled ("planned")
    return any(text.startswith(suffix, e) and not _letter_or_digit(text, e + len(suffix))
               for e in ends for suffix in _SUFFIXES)


@memoised(4096, 8 * 2**20)
def _term_pattern(term: str) -> re.Pattern[str]:
    if _cjk(term):
        return re.compile(re.escape(term))
    base = re.escape(term[:-1]) + "(?:i|y)" if term.endswith("i") and len(term) > 2 else re.escape(term)
    return re.compile(rf"(?<![^\W_]){base}(?:{re.escape(term[-1])})?(?:e|s|es|ed|d|ing|ly|'s)?(?![^\W_])")


def verdict(weighing: Weighing, asking: str) -> str:
    """``"pushed"``, ``"narrow"`` (pushed where the prompt has room: ``NARROW``) or why not: ``"no_match"`` (no archived page holds a specific term of the message the active
    pages lack), ``"weak"`` (the best page's match is not strong enough for this kind of message). ``asking``:
    ``"look_up"`` (a look-up phrase), ``"question"``, or ``""`` (a statement)."""
    if weighing.strength <= 0:
        return "no_match"
    if any(weighing.units >= needed and weighing.match >= share for needed, share in STRENGTH[asking]):
        return "pushed"
    if any(weighing.units >= needed and weighing.match >= share for needed, share in NARROW[asking]):
        return "narrow"
    return "weak"
