"""Token counting: a pluggable counter; the default is a CJK-aware estimate."""

from __future__ import annotations

import re
from typing import Any, Protocol, runtime_checkable

MESSAGE_OVERHEAD = 4  # role markers and separators of a chat template
IMAGE_TOKENS = 256  # flat cost of a non-text content part

# CJK ideographs, kana, hangul, full-width forms and CJK punctuation: about one token each.
_CJK = re.compile(
    "[\u1100-\u11ff\u2e80-\u2fdf\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3200-\u9fff"
    "\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\U00020000-\U0003ffff]"
)


@runtime_checkable
class TokenCounter(Protocol):
    def count_text(self, text: str) -> int: ...

    def count_message(self, message: dict[str, Any]) -> int: ...


def message_texts(message: dict[str, Any]) -> tuple[list[str], int]:
    """The texts of a message that reach the model, and the number of non-text content parts."""
    content = message.get("content")
    if len(message) == 2 and type(content) is str and "role" in message:
        return [content], 0  # the common chat message: {"role", "content": "..."}
    texts: list[str] = []
    others = 0
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                if isinstance(text, str):
                    texts.append(text)
                elif part.get("type") in ("image_url", "input_image", "image", "input_audio", "file"):
                    others += 1
                else:
                    texts.append(str(part))
            elif isinstance(part, str):
                texts.append(part)
    for key in ("reasoning_content", "name", "tool_call_id"):
        value = message.get(key)
        if isinstance(value, str):
            texts.append(value)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                texts.append(str(fn.get("name") or ""))
                texts.append(str(fn.get("arguments") or ""))
            if isinstance(call, dict):
                texts.append(str(call.get("id") or ""))
    return texts, others


class EstimateCounter:
    """CJK characters one token each, other text characters / 4, plus a per-message overhead."""

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        if text.isascii():
            return (len(text) + 3) // 4
        cjk = len(_CJK.findall(text))
        return cjk + (len(text) - cjk + 3) // 4

    def count_message(self, message: dict[str, Any]) -> int:
        texts, others = message_texts(message)
        return MESSAGE_OVERHEAD + others * IMAGE_TOKENS + sum(self.count_text(t) for t in texts)


class TokenizersCounter:
    """Exact counts from a Hugging Face `tokenizer.json` (needs the optional `tokenizers` package)."""

    def __init__(self, tokenizer_file: str) -> None:
        from tokenizers import Tokenizer  # imported lazily: optional dependency

        self._tokenizer = Tokenizer.from_file(tokenizer_file)

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_message(self, message: dict[str, Any]) -> int:
        texts, others = message_texts(message)
        return MESSAGE_OVERHEAD + others * IMAGE_TOKENS + sum(self.count_text(t) for t in texts)


def make_counter(tokenizer_file: str = "") -> TokenCounter:
    """The configured counter: a tokenizer when a file is given and `tokenizers` is installed, else the estimate."""
    if tokenizer_file:
        try:
            return TokenizersCounter(tokenizer_file)
        except Exception:  # missing package or unreadable file: fall back to the estimate
            return EstimateCounter()
    return EstimateCounter()
