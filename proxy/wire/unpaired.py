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

ESCAPE = "\ufdd0"
_ESCAPE = ESCAPE.encode()
# Anything that may need rewriting: a surrogate escape or ESCAPE (raw or escaped). One C-speed scan clears most bodies.
_MAYBE = re.compile(rb"\\u[dD][89a-fA-F]|\\u[fF][dD][dD]0|\xef\xb7\x90")
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
    return _INGRESS.sub(_inward, body) if _MAYBE.search(body) else body


def to_wire(body: bytes) -> bytes:
    """JSON that msgspec encoded from text ``to_internal`` produced, with the client's escapes back."""
    return _EGRESS.sub(_outward, body) if _ESCAPE in body else body

