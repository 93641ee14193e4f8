"""Content identities: entry hashes, prefix chains and the whole-request digest used to skip re-hashing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import xxhash

_encode_canonical = msgspec.json.Encoder(order="deterministic").encode
_encode_raw = msgspec.json.Encoder().encode
_h128 = xxhash.xxh3_128_hexdigest
_d128 = xxhash.xxh3_128_digest


def entry_hash(message: dict[str, Any]) -> str:
    """xxh3_128 hex of the canonical identity of one message (key order independent, unknown fields ignored)."""
    return entry_digest(message).hex()


def entry_digest(message: dict[str, Any]) -> bytes:
    """The 16-byte xxh3_128 digest behind `entry_hash`."""
    get = message.get
    return _d128(
        _encode_canonical(
            (
                get("role"),
                get("content"),
                get("name"),
                get("tool_calls"),
                get("tool_call_id"),
                get("reasoning_content"),
            )
        )
    )


def entry_hashes(messages: Iterable[dict[str, Any]]) -> list[str]:
    return [entry_hash(m) for m in messages]


def chain_hashes(hashes: Sequence[str], seed: str = "") -> list[str]:
    """Prefix chain: h_i = xxh3_128(h_{i-1} || entry_hash_i); h_-1 is ``seed`` (the end user's key: one user's
    messages never match another's prefix; "" without one)."""
    out: list[str] = []
    previous = seed
    for h in hashes:
        previous = _h128((previous + h).encode())
        out.append(previous)
    return out


def encode_messages(messages: Sequence[dict[str, Any]]) -> bytes | None:
    """Compact JSON array of the request's messages as sent (None when they cannot be encoded)."""
    try:
        return _encode_raw(messages)
    except (TypeError, ValueError, msgspec.EncodeError):
        return None


_WHITESPACE = b" \t\r\n"
_AFTER_ELEMENT = frozenset(b",] \t\r\n")


def elements_end(array: bytes | memoryview) -> int:
    """Index just past the last element of a JSON array's bytes (before trailing whitespace and `]`)."""
    end = len(array)
    while end and array[end - 1] in _WHITESPACE:
        end -= 1
    if end and array[end - 1] == 0x5D:  # ']'
        end -= 1
    while end and array[end - 1] in _WHITESPACE:
        end -= 1
    return end


def advance_prefix(array: bytes | None, known_end: int, known_digest: str) -> tuple[bool, int, str]:
    """Is the JSON array's start byte-identical to the one a state was built from? And the new marks.

    `known_end`/`known_digest` mark the end of the last element of the previous request's array and the
    digest of the bytes before it. JSON objects are self-delimiting, so equal bytes up to there, followed by
    a separator, mean the same leading messages. One pass of xxh3 over the array, no re-encoding.
    Returns (intact, new_end, new_digest); (False, 0, "") when `array` is None.
    """
    if array is None:
        return False, 0, ""
    view = memoryview(array)
    end = elements_end(view)
    intact = 0 < known_end <= end and (known_end == len(view) or view[known_end] in _AFTER_ELEMENT)
    if intact:
        hasher = xxhash.xxh3_128(view[:known_end])
        intact = hasher.hexdigest() == known_digest
        if intact:
            hasher.update(view[known_end:end])
            return True, end, hasher.hexdigest()
    return False, end, _h128(view[:end])
