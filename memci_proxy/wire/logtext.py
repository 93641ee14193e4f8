"""Client text in log lines: quoted, so it can never start a line of its own or pass for the proxy's words.

``field(value)`` is how every log call writes a value a client controls (a path, a blob reference, an error
that may quote a request): as a JSON string literal (quotes, ``\\n``, ``\\u2028`` and every other control
character escaped), cut to ``limit`` characters. The log filter of memci_proxy.log_redaction applies ``safe_arg`` to
every argument of every record as a second line of defence: text with a control character is quoted there too.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

LIMIT = 200
_encode = msgspec.json.Encoder().encode
# Characters that break or fake a log line: C0 and C1 controls, DEL, Unicode line and paragraph separators, and
# the bidirectional overrides that reorder what a terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def field(value: Any, limit: int = LIMIT) -> str:
    """``value`` as a bounded JSON string literal, e.g. ``"memci-blob://sha256/\\nFORGED"``."""
    text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    quoted = _encode(text[:limit]).decode()
    if _UNSAFE.search(quoted):  # JSON leaves U+2028/2029, C1 controls and bidi controls as they are
        quoted = _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)
    return quoted + (f"…(+{len(text) - limit} chars)" if cut else "")


def safe_arg(value: Any) -> Any:
    """A log record's argument, quoted with ``field`` when it is text holding a character that breaks a line."""
    if isinstance(value, (str, BaseException)):
        text = str(value)
        if _UNSAFE.search(text):
            return field(text, 1000)
    return value
