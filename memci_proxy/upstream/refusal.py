"""What an upstream's error answer says: is the prompt too long for its window, and which window does it state.

Engines word it differently (all seen as the body of a 400, some as 413, 422 or 500):
- OpenAI, llama-cpp-python, older vLLM: "This model's maximum context length is 4096 tokens. However, ..."
  (code ``context_length_exceeded``);
- vLLM: "... is longer than the maximum model length of 4096", "... maximum context length is 4096 tokens and your
  request has ..."; SGLang: "The input (5000 tokens) is longer than the model's context length (4096 tokens)" and
  "Requested token count exceeds the model's maximum context length of 4096 tokens" (the emulator's wording too),
  and for max_tokens alone over the window "max_completion_tokens is too large: 32000.This model supports at most
  4096 completion tokens";
- llama.cpp's server: "the request exceeds the available context size" with type ``exceed_context_size_error`` and
  the fields ``n_ctx`` / ``n_prompt_tokens``;
- Anthropic-style: "prompt is too long: 5000 tokens > 4096 maximum".

Pure: ``context_refusal(status, body)`` -> ``Refusal`` (``too_long``; ``window``, the upstream's stated window or
None; ``prompt_tokens``, the prompt as the upstream counted it, or None).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

REFUSAL_STATUSES = frozenset({400, 413, 422, 500})
_TOO_LONG = re.compile(
    r"context[ _](?:length|window|size)|maximum model length|max_model_len|prompt is too long|too many tokens"
    r"|exceeds? the (?:available )?context|input is too long|context_length_exceeded|exceed_context_size"
    r"|max_completion_tokens is too large",
    re.IGNORECASE)
_WINDOW = [re.compile(p, re.IGNORECASE) for p in (
    r"maximum context length (?:is|of) (\d+)",
    r"maximum model length (?:is |of )?(\d+)",
    r"model's context length \((\d+)",
    r"context (?:length|window|size) (?:is |of )\(?(\d+)",
    r"tokens? > (\d+) maximum",
    r"supports at most (\d+) completion tokens",
)]


# The prompt's size as the upstream counted it, where its refusal states it.
_PROMPT = [re.compile(p, re.IGNORECASE) for p in (
    r"(\d+) tokens from the input messages",  # SGLang, the emulator
    r"\((\d+) in the messages",  # OpenAI, llama-cpp-python
    r"your request has (\d+) input tokens",  # vLLM
    r"prompt is too long: (\d+) tokens",  # Anthropic-style
)]


@dataclass(frozen=True)
class Refusal:
    too_long: bool
    window: int | None = None
    prompt_tokens: int | None = None  # the prompt as the upstream counted it, when its error says


def _error_of(body: bytes) -> tuple[str, dict[str, Any]]:
    """The error's text (message, type and code) and its fields, from an OpenAI-style body or any other."""
    try:
        data = msgspec.json.decode(body)
    except (msgspec.DecodeError, ValueError):
        return body[:4000].decode("utf-8", "replace"), {}
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, str):
        return error, {}
    if not isinstance(error, dict):
        return str(error)[:4000], {}
    text = " ".join(str(error.get(k) or "") for k in ("message", "type", "code", "detail"))
    return text, error


def context_refusal(status: int, body: bytes) -> Refusal:
    """Whether an error answer refuses the prompt as too long for the upstream's window, and the window it states."""
    if status not in REFUSAL_STATUSES or not body:
        return Refusal(False)
    text, fields = _error_of(body)
    if not _TOO_LONG.search(text):
        return Refusal(False)
    prompt = fields.get("n_prompt_tokens")
    prompt = prompt if isinstance(prompt, int) and prompt > 0 else _first_number(_PROMPT, text)
    n_ctx = fields.get("n_ctx")
    if isinstance(n_ctx, int) and n_ctx > 0:
        return Refusal(True, n_ctx, prompt)
    return Refusal(True, _first_number(_WINDOW, text), prompt)


def _first_number(patterns: list[re.Pattern[str]], text: str) -> int | None:
    for pattern in patterns:
        found = pattern.search(text)
        if found and int(found.group(1)) > 0:
            return int(found.group(1))
    return None
