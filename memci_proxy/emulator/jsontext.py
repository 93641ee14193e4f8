"""The emulator's JSON encoding: msgspec, or the standard library's for text holding a lone surrogate (which JSON
escapes as "\\ud800" and msgspec cannot encode), as a real server writes back what a client sent it."""

from __future__ import annotations

import json
from typing import Any

import msgspec

_encode = msgspec.json.Encoder().encode


def encode(payload: Any) -> bytes:
    try:
        return _encode(payload)
    except UnicodeEncodeError:
        return json.dumps(payload, separators=(",", ":")).encode()
