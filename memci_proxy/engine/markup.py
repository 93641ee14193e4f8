"""The proxy's own markup in the prompt, and how text a client controls is kept from imitating it.

The proxy never parses its markup back out of text: hidden recall exchanges are spliced by position (the
state), the contents page is rendered from the state, blob references are honoured only for bytes the
tenant sent. What remains is the model, which reads the prompt as one text. So wherever the proxy *quotes*
client-derived text inside a block of its own (contents lines, recall results, search excerpts, the memory
and intent blocks, summaries and profile facts), ``quote`` neutralises look-alikes of that block's structure:

* the volatile block's tags ``<memci-context>``, ``<task-state>``, ``<intent>``, ``<memory>`` (and closers):
  ``<`` becomes ``&lt;``;
* a page header ``[Page N]`` and a decayed image ``[image memci-blob://...]``: a backslash before the ``[``;
* a markdown heading at the start of a line (the contents page, summary and memory headings): a backslash
  before the ``#``.

Look-alikes are found on a folded view of the text, so no spelling the model would read as the markup gets
through: every character NFKC-normalised, mapped to the ASCII character it can be mistaken for (Unicode's
confusables table, received as a ``LookAlikes`` adapter: Cyrillic ``а`` is ``a``, ``‹`` is ``<``) and case-folded
(a full-width ``＜`` is ``<``, a no-break space is a space); characters that show nothing on their own dropped
(format characters such as zero-width spaces, joiners, direction marks; combining marks such as U+034F or the
variation selectors U+FE00..U+FE0F); blank letters (U+3164 HANGUL FILLER, U+2800 BRAILLE PATTERN BLANK: every
character named ``... FILLER`` or ``... BLANK``), whitespace and control characters taken as a gap, allowed between
every part (``<\nmemci - context>``, ``[Page\u00a08]``). The escapes are then applied to the original characters.

The engine imports nothing outside the standard library, so the confusables table comes from outside: the
composition root hands ``use_look_alikes`` an adapter (``memci_proxy.confusables``, over the maintained
``confusable-homoglyphs`` package) once at start-up. Until then only the NFKC part of the folding applies. Text that a renderer normalises
(whitespace collapsed, cut to an excerpt) is quoted after that normalisation, so escaping is always the last
step.

The client's own messages are forwarded byte for byte, with one exception: the user message that carries
the proxy's ``<memci-context>`` block has the block's tags escaped in the client's text (``escape_tags``), so
the only block the model sees there is the proxy's. That message is rendered without the block (and so
unescaped) on later turns anyway: no cache is lost. Every function here is a pure function of its input, so
the same text always renders the same bytes (the prefix cache depends on it).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Protocol

from .memo import memoised

VOLATILE_TAGS = ("memci-context", "task-state", "intent", "memory")

# Patterns over the folded view (``_fold``): lower case, one " " per whitespace or control character, one "\n" per
# line break, format characters gone.
_GAP = r"[ \n]*"
_NAMES = "|".join(_GAP.join(re.escape(c) if c == "-" else c for c in _split_name) for _split_name in (
    ("memci", "-", "context"), ("task", "-", "state"), ("intent",), ("memory",)))
_TAG = re.compile(r"<(?=" + _GAP + r"(?:/" + _GAP + r")?(?:" + _NAMES + r")\b)")
_BRACKET = re.compile(r"(?<!\\)\[(?=" + _GAP + r"(?:page(?![a-z])|image" + _GAP + r"memci" + _GAP + r"-" + _GAP
                      + r"blob" + _GAP + r":" + _GAP + r"/" + _GAP + r"/))")
_HEADING = re.compile(r"^(?=[ ]{0,3}#{1,6}[ ])", re.MULTILINE)
_ANY = re.compile("|".join(p.pattern for p in (_TAG, _BRACKET, _HEADING)), re.MULTILINE)
# ASCII text folds character for character (no index map needed).
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_ASCII_FOLD = str.maketrans({**{chr(c): " " for c in range(32)}, "\x7f": " ",
                             **{c: "\n" for c in _LINE_BREAKS if c.isascii()}})
_MARKS = "<[#"
_NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")
_INVISIBLE = ("Cf", "Mn", "Me")  # format characters and combining marks: nothing of their own to see
_BLANK_NAMES = (" FILLER", " BLANK")


class LookAlikes(Protocol):
    """Unicode's confusables, as the engine needs them (an adapter outside the engine provides them)."""

    def ascii_of(self, char: str) -> str:
        """The ASCII character ``char`` can be mistaken for; "" when none."""

    def spellings_of(self, ascii_char: str) -> str:
        """Every character ``ascii_of`` maps to ``ascii_char``."""


class _NoLookAlikes:
    def ascii_of(self, char: str) -> str:
        return ""

    def spellings_of(self, ascii_char: str) -> str:
        return ""


_look_alikes: LookAlikes = _NoLookAlikes()
_MARK_SPELLINGS = re.compile("[<\\[#]")  # any character that folds to one of _MARKS


def use_look_alikes(look_alikes: LookAlikes) -> None:
    """Fold with ``look_alikes`` from now on (called once by the composition root, before any prompt is built:
    every process of a deployment folds the same way, so the same text renders the same bytes)."""
    global _look_alikes, _MARK_SPELLINGS
    _look_alikes = look_alikes
    spellings = "".join(look_alikes.spellings_of(m) for m in _MARKS)
    _MARK_SPELLINGS = re.compile("[" + re.escape(_MARKS + spellings) + "]")
    _fold_char.cache_clear()


@memoised(8192, 2 * 1024 * 1024)  # keys are single characters; values their short folds
def _fold_char(c: str) -> str:
    """What the model reads a character as, for finding look-alikes."""
    if c in _LINE_BREAKS:
        return "\n"
    category = unicodedata.category(c)
    if category in _INVISIBLE:
        return ""
    if c.isspace() or category[0] in "CZ" or unicodedata.name(c, "").endswith(_BLANK_NAMES):
        return " "
    normal = unicodedata.normalize("NFKC", c)
    folded = "".join(_look_alikes.ascii_of(n) or n for n in normal).casefold()
    return "".join(" " if f.isspace() else f for f in folded)


def _fold(text: str) -> tuple[str, list[int] | None]:
    """The folded view of ``text``, and for each of its characters the index of the character it came from
    (None: the same index, ASCII text). The ASCII runs of a mixed text fold as a whole (as ASCII text does), the
    other characters one by one."""
    if text.isascii():
        return text.translate(_ASCII_FOLD).lower(), None
    pieces: list[str] = []
    origin: list[int] = []
    done = 0
    for run in _NON_ASCII_RUN.finditer(text):
        start, end = run.span()
        if start > done:
            pieces.append(text[done:start].translate(_ASCII_FOLD).lower())
            origin.extend(range(done, start))
        for i in range(start, end):
            f = _fold_char(text[i])
            if f:
                pieces.append(f)
                origin.extend([i] * len(f))
        done = end
    if done < len(text):
        pieces.append(text[done:].translate(_ASCII_FOLD).lower())
        origin.extend(range(done, len(text)))
    return "".join(pieces), origin


def _may_hold_markup(text: str) -> bool:
    """A cheap test that clears most text: no character that folds to ``<``, ``[`` or ``#``."""
    if "<" in text or "[" in text or "#" in text:
        return True
    if text.isascii():
        return False
    normal = unicodedata.normalize("NFKC", text)
    return "<" in normal or "[" in normal or "#" in normal or _MARK_SPELLINGS.search(normal) is not None


def _escape(text: str, patterns: tuple[re.Pattern[str], ...]) -> str:
    folded, origin = _fold(text)
    edits: dict[int, str] = {}  # original index -> "lt" (the character becomes &lt;) or "bs" (a backslash before)
    for pattern in patterns:
        for match in pattern.finditer(folded):
            j = match.start()
            i = j if origin is None else origin[j]
            edits.setdefault(i, "lt" if pattern is _TAG else "bs")
    if not edits:
        return text
    out: list[str] = []
    last = 0
    for i in sorted(edits):
        out.append(text[last:i])
        if edits[i] == "lt":
            out.append("&lt;")
            last = i + 1
        else:
            out.append("\\")
            last = i
    out.append(text[last:])
    return "".join(out)


def escape_tags(text: str) -> str:
    """``text`` with look-alikes of the volatile block's tags made inert (``<`` -> ``&lt;``)."""
    if not text or not _may_hold_markup(text):
        return text
    return _escape(text, (_TAG,))


def quote(text: str) -> str:
    """Client-derived ``text`` as it may appear inside one of the proxy's blocks (see the module docstring).
    Idempotent: quoting quoted text changes nothing."""
    if not text or not _may_hold_markup(text):
        return text
    if text.isascii() and _ANY.search(text.translate(_ASCII_FOLD).lower()) is None:
        return text
    return _escape(text, (_TAG, _BRACKET, _HEADING))
