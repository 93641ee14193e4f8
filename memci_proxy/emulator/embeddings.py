"""Deterministic embeddings: a signed, hashed bag of words, normalised to unit length."""

from __future__ import annotations

import base64
import math
import re
import struct
import zlib
from typing import Any

from memci_proxy.emulator.errors import bad_request

_WORD = re.compile(r"[^\W\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]+|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


def embed(text: str, dimension: int) -> list[float]:
    """Unit vector of ``dimension`` floats; texts sharing words get similar vectors."""
    vector = [0.0] * dimension
    for word in _WORD.findall(text.lower()):
        digest = zlib.crc32(word.encode("utf-8"))
        vector[digest % dimension] += 1.0 if (digest >> 16) & 1 else -1.0
    norm = math.sqrt(sum(value * value for value in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [value / norm for value in vector]


def _inputs(body: dict[str, Any]) -> list[str]:
    value = body.get("input")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, str) for item in value):
            return list(value)
        if all(isinstance(item, int) for item in value):
            return [" ".join(str(item) for item in value)]
        if all(isinstance(item, list) and all(isinstance(token, int) for token in item) for item in value):
            return [" ".join(str(token) for token in item) for item in value]
    raise bad_request("'input' must be a string, an array of strings or an array of token arrays", param="input")


def embeddings_body(body: Any, dimension: int, model: str, count_tokens: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    texts = _inputs(body)
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise bad_request("'encoding_format' must be 'float' or 'base64'", param="encoding_format")
    data = []
    tokens = 0
    for index, text in enumerate(texts):
        vector = embed(text, dimension)
        tokens += count_tokens(text)
        embedding: Any = vector
        if encoding == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dimension}f", *vector)).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return {
        "object": "list",
        "data": data,
        "model": body.get("model") or model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
