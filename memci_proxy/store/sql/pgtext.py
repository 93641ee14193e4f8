"""Text PostgreSQL cannot hold, stored anyway: a reversible escaping applied to every text and JSON value the SQL
adapter writes, and undone on every value it reads, so that nothing above the store sees it.

PostgreSQL refuses U+0000 in ``text`` and in ``jsonb`` (``\\u0000``), and a lone surrogate (U+D800..U+DFFF)
cannot even be encoded as UTF-8. Both are ordinary in what clients send (binary bytes in a tool's output). They
are written as two or six characters led by ESCAPE, a noncharacter (U+FDD0, reserved by Unicode for a program's
internal use), and ESCAPE itself is doubled, so that a client's text holding it round-trips too:

    ESCAPE -> ESCAPE ESCAPE      U+0000 -> ESCAPE "0"      lone surrogate U+XXXX -> ESCAPE "u" XXXX (hex, lower)

Search indexes built from the stored (escaped) text find words as before; the escapes are words of their own.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

ESCAPE = "\ufdd0"
_ESCAPE_UTF8 = ESCAPE.encode()
_NEEDS_ESCAPE = re.compile("[\x00\ud800-\udfff\ufdd0]")
_ESCAPED = re.compile("\ufdd0(?:\ufdd0|0|u[0-9a-f]{4})")
_json = msgspec.json.Encoder()


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    if char == ESCAPE:
        return ESCAPE + ESCAPE
    if char == "\x00":
        return ESCAPE + "0"
    return f"{ESCAPE}u{ord(char):04x}"


def _unescape_one(match: re.Match[str]) -> str:
    code = match.group()[1:]
    if code == ESCAPE:
        return ESCAPE
    if code == "0":
        return "\x00"
    return chr(int(code[1:], 16))


def escape(value: str) -> str:
    """``value`` as text PostgreSQL can store (itself when nothing needs escaping: the common case)."""
    if value.isascii() and "\x00" not in value:
        return value
    return _NEEDS_ESCAPE.sub(_escape_one, value)


def unescape(value: str) -> str:
    """The text ``escape`` was given."""
    if ESCAPE not in value:
        return value
    return _ESCAPED.sub(_unescape_one, value)


def escape_optional(value: str | None) -> str | None:
    return None if value is None else escape(value)


def unescape_optional(value: str | None) -> str | None:
    return None if value is None else unescape(value)


def _walk(value: Any, change: Any) -> Any:
    """``value`` (decoded JSON) with ``change`` applied to every string in it, keys too."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {change(k) if isinstance(k, str) else k: _walk(v, change) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, change) for v in value]
    return value


def escape_json(value: Any) -> Any:
    return _walk(value, escape)


def unescape_json(value: Any) -> Any:
    return _walk(value, unescape)


def dumps(value: Any) -> str:
    """``value`` as JSON text that ``jsonb`` accepts: escaped only when it holds something to escape (one scan of
    the encoded bytes decides)."""
    try:
        encoded = _json.encode(value)
    except UnicodeEncodeError:  # a lone surrogate
        return _json.encode(escape_json(value)).decode()
    if b"\\u0000" in encoded or _ESCAPE_UTF8 in encoded:
        return _json.encode(escape_json(value)).decode()
    return encoded.decode()


def loads(text: str | bytes) -> Any:
    """JSON text that ``dumps`` wrote, decoded with its escapes undone."""
    value = msgspec.json.decode(text)
    if (_ESCAPE_UTF8 if isinstance(text, bytes) else ESCAPE) in text:
        return unescape_json(value)
    return value
