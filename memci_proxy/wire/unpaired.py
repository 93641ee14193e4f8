"""Lone surrogates in a client's JSON: accepted, carried through the proxy, and sent upstream as the client wrote them.

JSON may escape a UTF-16 surrogate that has no partner (``"\\ud800"``); Python's ``json`` decodes it, but msgspec (the
proxy's codec) refuses it both ways, and PostgreSQL cannot store it. A managed body is therefore rewritten once, as
bytes, when it arrives (``to_internal``): each lone surrogate escape becomes six characters led by ESCAPE (U+FDD0, a
noncharacter Unicode reserves for a program's internal use), and ESCAPE itself, raw or escaped, is doubled so that a
client's own ESCAPE round-trips:

    "\\ud800" -> ESCAPE "ud800"          ESCAPE -> ESCAPE ESCAPE          "\\ud83d\\ude00" (a pair) -> unchanged

Everything after that (hashing, counting, the engine, the store, Redis) sees ordinary text. ``to_wire`` undoes it on
the bytes of a body msgspec encoded for the upstream (msgspec writes ESCAPE as raw UTF-8, never escaped), so the
upstream sees the client's ``\\ud800`` again; recall results read back from the store undo the same way.
"""

from __future__ import annotations

import re

import msgspec

ESCAPE = "\ufdd0"
_ESCAPE = ESCAPE.encode()
_decode = msgspec.json.Decoder().decode
# (sre's search for a literal is several times faster than bytes' `in` for these needles)
_RAW_ESCAPE = re.compile(re.escape(_ESCAPE))
_CODE_POINT_ESCAPE = re.compile(rb"\\u")
_ESCAPED_ESCAPE = re.compile(rb"\\ufdd0")  # in lower case
_SURROGATE_ESCAPE = re.compile(rb"\\ud[89a-f]")  # in lower case
# Escaped backslashes are consumed first, so that every "\u" matched opens a real escape.
_INGRESS = re.compile(
    rb"\\\\|\\u([dD][89abAB][0-9a-fA-F]{2})(\\u[dD][c-fC-F][0-9a-fA-F]{2})?|\\u([dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|\\u[fF][dD][dD]0|\xef\xb7\x90"
)
_EGRESS = re.compile(b"\xef\xb7\x90(\xef\xb7\x90|u(d[89a-f][0-9a-f]{2}))")


def _inward(match: re.Match[bytes]) -> bytes:
    high, low, lone_low = match.groups()
    if high is not None:
        return match.group() if low is not None else _ESCAPE + b"u" + high.lower()
    if lone_low is not None:
        return _ESCAPE + b"u" + lone_low.lower()
    if match.group() == b"\\\\":
        return b"\\\\"
    return _ESCAPE + _ESCAPE


def _outward(match: re.Match[bytes]) -> bytes:
    code = match.group(2)
    return _ESCAPE if code is None else b"\\u" + code


def to_internal(body: bytes) -> bytes:
    """A client's JSON body with its lone surrogates (and ESCAPE) written as ESCAPE sequences; itself when it has
    none (the common case)."""
    return _INGRESS.sub(_inward, body) if _may_need_rewriting(body) else body


def _may_need_rewriting(body: bytes) -> bool:
    """Whether ``body`` may hold ESCAPE or a lone surrogate escape. Two C-speed scans clear most bodies (about as
    long as decoding an ASCII body, a third of a Chinese one); a body holding surrogate escapes is cleared when
    msgspec, which refuses lone ones, decodes it."""
    if not body.isascii() and _RAW_ESCAPE.search(body) is not None:
        return True
    if _CODE_POINT_ESCAPE.search(body) is None:  # most bodies
        return False
    lowered = body.lower()
    if _ESCAPED_ESCAPE.search(lowered) is not None:
        return True
    if _SURROGATE_ESCAPE.search(lowered) is None:
        return False
    try:
        _decode(body)
    except Exception:  # noqa: BLE001 - any body msgspec refuses is rewritten (the route reports what is wrong)
        return True
    return False


def to_wire(body: bytes) -> bytes:
    """JSON that msgspec encoded from text ``to_internal`` produced, with the client's escapes back."""
    if body.isascii() or _RAW_ESCAPE.search(body) is None:
        return body
    return _EGRESS.sub(_outward, body)

