"""The summariser: the upstream model (or another OpenAI-compatible one) called with short fixed prompts.

``ModelSummarizer.complete(instruction, text, max_tokens)`` posts ``{base_url}/chat/completions`` (non-streaming,
temperature 0): a system message with the instruction, one user message with the text. Any failure (HTTP
status, time-out, bad body, empty answer) raises ``SummaryFailed``: the caller backs off and the extractive
contents lines keep serving. When no model name is configured, the first model of ``{base_url}/models`` is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
import msgspec

from memci_proxy.upstream.refusal import context_refusal

PAGES_PROMPT = (
    "Summarise the following part of a conversation between a user and an assistant in a few sentences: "
    "decisions, facts, open questions and names that later turns may need. Reply with the summary only."
)
COMPRESS_PROMPT = (
    "Compress this summary of a conversation to about {words} words, keeping decisions, facts and names. "
    "Reply with the compressed summary only."
)
DAY_PROMPT = (
    "Summarise the messages of one day ({period}) of a conversation in a short paragraph: what was discussed, "
    "decided and left open. Reply with the summary only."
)
MONTH_PROMPT = (
    "Summarise one month ({period}) of a conversation from its daily summaries in a short paragraph: the main "
    "topics, decisions and facts. Reply with the summary only."
)
PROFILE_PROMPT = (
    "From the conversation below, list stable facts about the user that stay true across conversations "
    "(name, role, preferences, languages, projects, environment). One fact per line, each starting with '- '. "
    "Reply NONE when there is none."
)


WORKER_PROMPTS = (PAGES_PROMPT, COMPRESS_PROMPT, DAY_PROMPT, MONTH_PROMPT, PROFILE_PROMPT)


_encode = msgspec.json.Encoder().encode  # as the proxy encodes the turn's bodies: the same bytes for the same prefix


class SummaryFailed(Exception):
    """The summariser gave no usable answer."""


class AnsweredWithToolCall(SummaryFailed):
    """A job on a conversation's prompt (its tools offered) was answered with a tool call instead of text."""


class PromptTooLong(SummaryFailed):
    """A job on a conversation's prompt was refused by the upstream as longer than its window (the prompt, kept byte
    for byte, plus the instruction and the summary's answer: a conversation whose fixed part nearly fills the
    window). Resending it cannot help; the job's plain prompt can."""


class Summarizer(Protocol):
    async def complete(self, instruction: str, text: str, max_tokens: int) -> str: ...

    # Optional (memci_proxy.workers.prefix): ``complete_after(body, base_url, auth)`` posts a whole prepared request body to
    # ``{base_url}/chat/completions`` (with ``auth`` as its Authorization, when not empty) and returns the answer's
    # text; a summariser without it gets plain jobs only.


class ModelSummarizer:
    def __init__(
        self,
        base_url: str,
        model: str = "",
        api_key: str = "",
        timeout_s: float = 60.0,
        session: aiohttp.ClientSession | None = None,
        on_usage: Callable[[Any], None] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_usage = on_usage  # called with each answer's `usage` (the memory jobs' token metrics)
        self.model = model
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._post_headers = {**self._headers, "Content-Type": "application/json"}
        self._session = session
        self._owns_session = session is None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8))
            self._owns_session = True
        return self._session

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None and not self._session.closed:
            await self._session.close()

    async def _model_name(self) -> str:
        if self.model:
            return self.model
        try:
            async with self._client().get(
                f"{self.base_url}/models", headers=self._headers, timeout=aiohttp.ClientTimeout(total=10)
            ) as response:
                payload = await response.json(content_type=None) if response.status == 200 else {}
            data = payload.get("data") if isinstance(payload, dict) else None
            if isinstance(data, list) and data and isinstance(data[0], dict) and data[0].get("id"):
                self.model = str(data[0]["id"])
                return self.model
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass
        return "default"

    async def complete(self, instruction: str, text: str, max_tokens: int) -> str:
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "messages": [{"role": "system", "content": instruction}, {"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": max(8, int(max_tokens)),
            "stream": False,
        }
        return await self.complete_after(body, self.base_url)

    async def complete_after(self, body: dict[str, Any], base_url: str, auth: str = "") -> str:
        """A prepared body (a prefix job: the conversation's last prompt plus one instruction) posted to
        ``base_url`` (the upstream worker the conversation is routed to; empty: the summariser's own), with ``auth``
        (the Authorization the conversation's request carried upstream) when there is one, else the summariser's
        key."""
        base_url = base_url or self.base_url
        headers = {"Authorization": auth, "Content-Type": "application/json"} if auth else self._post_headers
        try:
            async with self._client().post(
                f"{base_url.rstrip('/')}/chat/completions", data=_encode(body), headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as response:
                if response.status != 200:
                    if context_refusal(response.status, await response.read()).too_long:
                        raise PromptTooLong(f"summariser answered HTTP {response.status}: the prompt is too long")
                    raise SummaryFailed(f"summariser answered HTTP {response.status}")
                payload = await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise SummaryFailed(f"summariser unreachable: {type(exc).__name__}") from exc
        if self.on_usage is not None and isinstance(payload, dict):
            self.on_usage(payload.get("usage"))
        try:
            message = payload["choices"][0]["message"]
            content = message.get("content")
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise SummaryFailed("summariser answer without content") from exc
        if (not isinstance(content, str) or not content.strip()) and message.get("tool_calls"):
            raise AnsweredWithToolCall("summariser answered with a tool call")
        if not isinstance(content, str) or not content.strip():
            raise SummaryFailed("summariser answered nothing")
        return content.strip()
