"""The model level of the intent rewrite: a small model on an OpenAI-compatible base URL, tight timeout.

``ModelRewriter(base_url, model, timeout_s=0.3)`` posts ``{base_url}/chat/completions`` with a short fixed
prompt (``build_prompt``), ``temperature`` 0 and ``max_tokens`` 64, non-streaming, and returns the
standalone query, or ``None`` on timeout, HTTP error, bad body or an unusable answer (empty, a refusal
shape, far longer than the conversation warrants). It never raises for those: the caller falls back to
the rules. One aiohttp session per client (own connection pool); close it with ``aclose()`` or use
``async with``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from memci_proxy.engine.intent import message_text

__all__ = ["SYSTEM_PROMPT", "ModelRewriter", "build_prompt", "clean_answer"]

SYSTEM_PROMPT = (
    "Rewrite the user's last message as one standalone question or request that can be understood without "
    "the conversation: replace pronouns and references with what they refer to, fill in omitted words, keep "
    "the user's language and meaning, add nothing else. Reply with the rewritten message only."
)
HISTORY_MESSAGES = 6
HISTORY_CHARS = 600  # per message, in the prompt
MAX_ANSWER_CHARS = 1000
_PREFIXES = ("standalone intent:", "rewritten:", "rewrite:", "standalone:", "query:", "answer:")


def build_prompt(history: Sequence[Mapping[str, Any]], last_user: str) -> list[dict[str, str]]:
    """The chat messages sent to the rewrite model: the fixed instruction, then one user message holding
    the recent conversation and the message to rewrite (the latter last, so markers in it are read)."""
    lines = []
    for message in list(history)[-HISTORY_MESSAGES:]:
        role = message.get("role")
        if role not in ("user", "assistant"):
            continue
        text = " ".join(message_text(message).split())
        if text:
            lines.append(f"{role}: {text[:HISTORY_CHARS]}")
    conversation = "\n".join(lines) if lines else "(none)"
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Conversation:\n{conversation}\n\nLast message:\n{last_user}"},
    ]


def clean_answer(answer: str, last_user: str) -> str | None:
    """The model's answer as a query: one line, quotes and labels stripped; None when unusable."""
    text = answer.strip()
    lowered = text.lower()
    for prefix in _PREFIXES:
        if lowered.startswith(prefix):
            text = text[len(prefix) :].strip()
            break
    text = " ".join(text.split())
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()
    if not text or len(text) > max(MAX_ANSWER_CHARS, 4 * len(last_user)):
        return None
    return text


class ModelRewriter:
    """Client of the model level (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        timeout_s: float = 0.3,
        api_key: str = "",
        max_tokens: int = 64,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> "ModelRewriter":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=60))
            self._owns_session = True
        return self._session

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()

    async def rewrite(self, history: Sequence[Mapping[str, Any]], last_user: str) -> str | None:
        """The standalone query from the model, or None (timeout, error, unusable answer)."""
        body = {
            "model": self.model,
            "messages": build_prompt(history, last_user),
            "temperature": 0,
            "max_tokens": self.max_tokens,
            "stream": False,
        }
        try:
            async with self._client().post(
                self.url, json=body, headers=self._headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as response:
                if response.status != 200:
                    return None
                payload = await response.json(content_type=None)
            content = payload["choices"][0]["message"]["content"]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError, TypeError):
            return None
        if not isinstance(content, str):
            return None
        return clean_answer(content, last_user)
