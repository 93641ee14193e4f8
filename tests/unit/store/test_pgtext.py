"""The store's escaping of what PostgreSQL cannot hold: it round-trips any text, and what it writes holds none of it."""

from __future__ import annotations

import re

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.store.sql import pgtext

# Any code point, lone surrogates included, with the escape character and NUL made common.
_CHARS = st.one_of(st.characters(codec=None, categories=None), st.sampled_from(["\x00", pgtext.ESCAPE, "0", "u",
                                                                                 "\ud800", "\udfff", "\\"]))
TEXT = st.text(alphabet=_CHARS, max_size=40)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _storable(text: str) -> bool:
    """What PostgreSQL text accepts: no NUL, and UTF-8 encodable."""
    return _UNSTORABLE.search(text) is None


@given(TEXT)
def test_text_round_trips_and_is_storable(text: str) -> None:
    escaped = pgtext.escape(text)
    assert _storable(escaped)
    assert pgtext.unescape(escaped) == text


@given(JSON)
def test_json_round_trips_and_is_storable(value: object) -> None:
    stored = pgtext.dumps(value)
    assert _storable(stored) and "\\u0000" not in stored  # jsonb refuses the escape too
    stored.encode("utf-8")
    assert pgtext.loads(stored) == value
    assert pgtext.loads(stored.encode()) == value


def test_the_escape_itself_round_trips() -> None:
    for text in (pgtext.ESCAPE, pgtext.ESCAPE + "0", pgtext.ESCAPE + "ud800", pgtext.ESCAPE * 3 + "\x00"):
        assert pgtext.unescape(pgtext.escape(text)) == text
        assert pgtext.escape(text) != text


def test_plain_text_is_left_alone() -> None:
    for text in ("hello", "héllo 中文", "a\\u0000b"):
        assert pgtext.escape(text) is text
        assert pgtext.dumps({"k": text}) == msgspec.json.encode({"k": text}).decode()
