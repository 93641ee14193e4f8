"""Deterministic tokenizer of the emulator.

Rules, applied left to right:
- special tokens (``<|im_start|>``, ``<tool_call>``, ...) are one token each;
- each CJK character (ideographs, kana, hangul, CJK and full-width punctuation) is one token;
- a run of other word characters is one token;
- each newline is one token; a run of other whitespace is one token;
- any other character (punctuation, symbols) is one token.

Newlines are single tokens so that tokenizing a prompt that ends with ``\\n`` followed by an answer gives
the same tokens as tokenizing their concatenation. Token strings are interned to integer ids.
"""

from __future__ import annotations

import re

SPECIAL_TOKENS: tuple[str, ...] = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
)

_CJK = (
    "\u3000-\u303f"  # CJK symbols and punctuation
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff00-\uffef"  # half-width and full-width forms
)

_TOKEN_PATTERN = re.compile(
    "|".join(re.escape(token) for token in SPECIAL_TOKENS)
    + f"|[{_CJK}]"
    + f"|[^\\W{_CJK}]+"
    + "|\\n"
    + "|[^\\S\\n]+"
    + "|[^\\w\\s]"
)


class _Vocabulary(dict[str, int]):
    """Interning table: a token string gets the next free id the first time it is seen."""

    def __missing__(self, token: str) -> int:
        token_id = len(self)
        self[token] = token_id
        return token_id


class Tokenizer:
    def __init__(self, memo_entries: int = 20_000, memo_chars: int = 32_000_000) -> None:
        self._memo: dict[str, list[int]] = {}
        self._memo_entries = memo_entries
        self._memo_chars_limit = memo_chars
        self._memo_chars = 0
        self._vocabulary = _Vocabulary()
        for token in SPECIAL_TOKENS:
            self._vocabulary[token]  # noqa: B018 - reserve the first ids for the special tokens
        self._split = _TOKEN_PATTERN.findall

    def split(self, text: str) -> list[str]:
        """The token strings of ``text``; their concatenation is ``text``."""
        return self._split(text)

    def ids_of(self, tokens: list[str]) -> list[int]:
        return list(map(self._vocabulary.__getitem__, tokens))

    def encode(self, text: str) -> list[int]:
        return list(map(self._vocabulary.__getitem__, self._split(text)))

    def encode_pieces(self, pieces: list[str]) -> list[int]:
        """Token ids of the concatenation of ``pieces``; each piece must start and end at a token boundary.

        Pieces are memoised (turns of a conversation come back in every later request).
        """
        memo = self._memo
        ids: list[int] = []
        for piece in pieces:
            piece_ids = memo.get(piece)
            if piece_ids is None:
                piece_ids = self.encode(piece)
                self._memo_chars += len(piece)
                while memo and (len(memo) >= self._memo_entries or self._memo_chars > self._memo_chars_limit):
                    oldest = next(iter(memo))
                    self._memo_chars -= len(oldest)
                    del memo[oldest]
                memo[piece] = piece_ids
            ids += piece_ids
        return ids

    def count(self, text: str) -> int:
        return len(self._split(text))

    def token_id(self, token: str) -> int:
        return self._vocabulary[token]

    end_of_turn_id = SPECIAL_TOKENS.index("<|im_end|>")  # special tokens hold the first ids

    @property
    def vocabulary_size(self) -> int:
        return len(self._vocabulary)
