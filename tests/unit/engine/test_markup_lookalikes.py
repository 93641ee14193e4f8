"""Look-alikes of the proxy's markup (property-based): whatever spelling a client uses (NFKC variants such as
full-width or mathematical letters, Unicode's confusables such as Cyrillic letters, any case, any whitespace,
control, format or combining characters or blank letters between the parts), the text the proxy renders from it
holds none of the markup as a model reads it: after NFKC and the confusables table, with format characters and
combining marks dropped, blank letters and whitespace collapsed. Checked on every renderer that quotes client text, including the
ones that normalise whitespace or cut an excerpt (escaping must come after that)."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest
from confusable_homoglyphs.confusables import confusables_data
from hypothesis import given, settings
from hypothesis import strategies as st

from memci_proxy.confusables import install

from memci_proxy.engine.contents import summary_line
from memci_proxy.engine.markup import escape_tags, quote
from memci_proxy.recall.push.memory_block import memory_line
from memci_proxy.recall.reading.pagetext import excerpt, render_page


def _lookalike_table() -> dict[str, list[str]]:
    """ASCII character -> every character whose NFKC case-fold is exactly it (full-width, mathematical, ...)."""
    wanted = set("<>[]#/-:abcdefghijklmnopqrstuvwxyz0123456789")
    table: dict[str, list[str]] = {c: [c] for c in wanted}
    for code in range(0x80, 0x20000):
        c = chr(code)
        folded = unicodedata.normalize("NFKC", c).casefold()
        if folded in wanted:
            table[folded].append(c)
    for c in "abcdefghijklmnopqrstuvwxyz":
        table[c].append(c.upper())
    for c, glyphs in confusables_data.items():  # Unicode's confusables of each character (Cyrillic а for a, ...)
        ascii_glyphs = [g["c"] for g in glyphs if len(g["c"]) == 1 and g["c"].isascii()]
        if not c.isascii() and ascii_glyphs and ascii_glyphs[0].casefold() in wanted:
            table[ascii_glyphs[0].casefold()].append(c)
    return table


@pytest.fixture(scope="module", autouse=True)
def look_alikes():
    install()  # as the composition root does


LOOK = _lookalike_table()
GAPS = (" \t\n\r\x0b\x0c\x00\x01\x1b\x1f\x7f\x85\xa0\xad\u1680\u180e\u2000\u2007\u200a\u200b\u200c\u200d\u200e"
        "\u2028\u2029\u202f\u205f\u2060\u3000\ufeff\u034f\ufe00\ufe0f\u3164\u2800\u115f\uffa0")
FORMS = [
    ["<", "memci", "-", "context", ">"], ["<", "/", "memci", "-", "context", ">"], ["<", "task", "-", "state", ">"],
    ["<", "intent", ">"], ["<", "/", "memory", ">"], ["[", "page", "8", "]"], ["[", "page", "12.2", "]"],
    ["[", "image", "memci", "-", "blob", ":", "/", "/", "sha256/ab", "]"], ["\n", "#", "#", " ", "memory"],
]


def _spelled(part: str, draw) -> str:
    return "".join(draw(st.sampled_from(LOOK.get(c, [c]))) for c in part)


@st.composite
def lookalike(draw) -> str:
    form = draw(st.sampled_from(FORMS))
    gap = st.text(alphabet=GAPS, max_size=4)
    out = []
    for i, part in enumerate(form):
        out.append(_spelled(part, draw))
        if i + 1 < len(form) and part not in ("\n", "#") and form[i + 1] != "#":
            out.append(draw(gap))
    return "".join(out)


texts = st.lists(st.one_of(lookalike(), st.text(max_size=6), st.sampled_from([" ", "\n", "words ", "\\"])),
                 min_size=1, max_size=8).map("".join)

_GAP = r"[\s\x00-\x1f\x7f-\x9f]*"
_SEEN_TAG = re.compile(r"<" + _GAP + r"/?" + _GAP + r"(?:memci" + _GAP + "-" + _GAP + "context|task" + _GAP + "-"
                       + _GAP + r"state|intent|memory)\b")
_SEEN_BRACKET = re.compile(r"(?<!\\)\[" + _GAP + r"(?:page(?![a-z])|image" + _GAP + r"memci" + _GAP + "-" + _GAP
                           + "blob" + _GAP + ":" + _GAP + "/" + _GAP + "/)")
_SEEN_HEADING = re.compile(r"^[ \t\xa0]{0,3}#{1,6}[ \t\xa0]", re.MULTILINE)


def _ascii_of(c: str) -> str:
    glyphs = [g["c"] for g in confusables_data.get(c, ()) if len(g["c"]) == 1 and g["c"].isascii()]
    return glyphs[0] if glyphs and not c.isascii() else c


def seen(text: str) -> str:
    """The text as a model reads it: NFKC, confusables to ASCII, case-folded, format characters and combining marks
    dropped, blank letters as spaces."""
    out = []
    for c in unicodedata.normalize("NFKC", text):
        if unicodedata.category(c) in ("Cf", "Mn", "Me"):
            continue
        out.append(" " if unicodedata.name(c, "").endswith((" FILLER", " BLANK")) else _ascii_of(c))
    return "".join(out).casefold()


def holds_markup(text: str, headings: bool = True) -> bool:
    view = seen(text)
    lines = re.sub(r"[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]", "\n", view)
    return bool(_SEEN_TAG.search(view) or _SEEN_BRACKET.search(view)
                or (headings and _SEEN_HEADING.search(lines)))


def test_the_generator_makes_markup_a_model_would_read():
    assert holds_markup("[Page\u00a08]") and holds_markup("<\nmemci-context>") and holds_markup("\uff1cmemory>")
    assert holds_markup("<mem\u200bci-context>") and not holds_markup("&lt;memci-context> \\[Page 8]")


@given(texts)
@settings(max_examples=250, deadline=None)
def test_no_lookalike_survives_quoting(text: str) -> None:
    quoted = quote(text)
    assert not holds_markup(quoted), (text, quoted)
    assert quote(quoted) == quoted  # idempotent
    if not holds_markup(text) and "<" not in text and "[" not in text and "#" not in text and text.isascii():
        assert quoted == text


@given(texts)
@settings(max_examples=300, deadline=None)
def test_no_lookalike_survives_any_renderer(text: str) -> None:
    collapsed = " ".join(text.split())
    rendered = [
        excerpt(text, ["words"]), excerpt(quote(text), ["page", "memory"], limit=40),
        memory_line("page 3", text)[len("[page 3] "):],
        memory_line("page 3", quote(text), cut_chars=30)[len("[page 3] "):],
        summary_line({"role": "user", "content": text}, 120), quote(collapsed),
        render_page("3", 0.0, "archived", [{"role": "user", "content": text}]).split("\n", 1)[1],
    ]
    for out in rendered:
        assert not holds_markup(out), (text, out)
        assert not holds_markup(" ".join(out.split()), headings=False), (text, out)  # later normalisation too


@given(texts)
@settings(max_examples=200, deadline=None)
def test_escape_tags_catches_every_tag_lookalike(text: str) -> None:
    escaped = escape_tags(text)
    assert not _SEEN_TAG.search(seen(escaped)), (text, escaped)


def test_the_audit_probes():
    assert quote("[Page\u00a08] x") == "\\[Page\u00a08] x"
    assert excerpt("[Page\u00a08] x", ["x"]) == "\\[Page 8] x"
    assert excerpt("<\nmemci-context> y", ["y"]) == "&lt; memci-context> y"
    assert sys.maxunicode > 0x20000


def _fold_by_character(text: str) -> tuple[str, list[int] | None]:
    from memci_proxy.engine.markup import _ASCII_FOLD, _fold_char

    if text.isascii():
        return text.translate(_ASCII_FOLD).lower(), None
    pieces: list[str] = []
    origin: list[int] = []
    for i, c in enumerate(text):
        folded = _fold_char(c)
        if folded:
            pieces.append(folded)
            origin.extend([i] * len(folded))
    return "".join(pieces), origin


@given(st.text(alphabet=st.sampled_from("aZ <[#\n\r\t\x00\x0b\x1c\x7f…éßﬁ＜［＃\u200b\u00a0\u2028İǅ中") | st.characters()))
def test_a_mixed_text_folds_as_it_does_character_by_character(text: str) -> None:
    from memci_proxy.engine.markup import _fold

    assert _fold(text) == _fold_by_character(text)
