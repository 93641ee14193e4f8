import base64
import math
import struct

import pytest

from memci_proxy.emulator.embeddings import embed, embeddings_body
from memci_proxy.emulator.errors import ErrorReply


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def test_vectors_are_unit_length_and_deterministic() -> None:
    for text in ["", "hello world", "你好世界", "a b c d e f g"]:
        vector = embed(text, 64)
        assert len(vector) == 64
        assert math.isclose(math.sqrt(sum(v * v for v in vector)), 1.0, rel_tol=1e-9)
        assert vector == embed(text, 64)


def test_texts_sharing_words_are_closer() -> None:
    base = embed("the red fox jumps over the lazy dog", 64)
    near = embed("a red fox jumps over a dog", 64)
    far = embed("quantum chromodynamics lecture notes", 64)
    assert cosine(base, near) > cosine(base, far)


def test_response_shape_and_base64_encoding() -> None:
    reply = embeddings_body({"input": ["one two", "three"], "model": "m"}, 8, "default", lambda text: 2)
    assert reply["object"] == "list" and reply["model"] == "m"
    assert [item["index"] for item in reply["data"]] == [0, 1]
    assert reply["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    encoded = embeddings_body({"input": "one two", "encoding_format": "base64"}, 8, "default", len)
    floats = struct.unpack("<8f", base64.b64decode(encoded["data"][0]["embedding"]))
    assert [round(x, 5) for x in floats] == [round(x, 5) for x in reply["data"][0]["embedding"]]


def test_bad_input_is_400() -> None:
    with pytest.raises(ErrorReply):
        embeddings_body({"input": 3}, 8, "m", len)
