"""Content identities: entry hashes, prefix chains and the whole-request digest used to skip re-hashing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import xxhash

_encode_canonical = msgspec.json.Encoder(order="deterministic").encode
_encode_raw = msgspec.json.Encoder().encode
_h128 = xxhash.xxh3_128_hexdigest


def entry_hash(message: dict[str, Any]) -> str:
    """xxh3_128 hex of the canonical identity of one message (key order independent, unknown fields ignored)."""
    get = message.get
    return _h128(
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


def chain_hashes(hashes: Sequence[str]) -> list[str]:
    """Prefix chain: h_i = xxh3_128(h_{i-1} || entry_hash_i); h_-1 is the empty string."""
    out: list[str] = []
    previous = ""
    for h in hashes:
        previous = _h128((previous + h).encode())
        out.append(previous)
    return out


def encode_messages(messages: Sequence[dict[str, Any]]) -> bytes | None:
    """Raw JSON of the request's messages as sent (None when they cannot be encoded)."""
    try:
        return _encode_raw(messages)
    except (TypeError, ValueError, msgspec.EncodeError):
        return None


def digest_prefix(encoded: bytes, length: int) -> str:
    """Digest of the first `length` encoded bytes without the closing bracket of the list."""
    return _h128(memoryview(encoded)[: max(0, length - 1)])


def known_prefix_intact(encoded: bytes | None, known_length: int, known_digest: str) -> bool:
    """True when the request's leading messages are byte-identical to the ones a state was built from.

    `known_length`/`known_digest` describe the raw encoding of the previous request's messages. JSON values
    are self-delimiting, so equal bytes up to the previous closing bracket (followed here by ',' or ']')
    mean the same leading messages.
    """
    if encoded is None or known_length <= 0 or len(encoded) < known_length:
        return False
    if encoded[known_length - 1] not in (0x2C, 0x5D):  # ',' or ']'
        return False
    return digest_prefix(encoded, known_length) == known_digest
