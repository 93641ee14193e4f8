"""Describes one image with a vision model behind an OpenAI-compatible chat completions endpoint."""

from __future__ import annotations

from typing import Any

import aiohttp

DEFAULT_PROMPT = (
    "Describe this image for a reader who cannot see it, in at most 80 words: what it shows, any text in it "
    "word for word, and any error message, number or code it contains. Plain text, no preamble."
)


class VisionError(Exception):
    """The vision model did not give a description (network, HTTP status, empty or malformed answer)."""


class VisionClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "",
        timeout: float = 60.0,
        max_tokens: int = 300,
        prompt: str = DEFAULT_PROMPT,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.max_tokens = max_tokens
        self.prompt = prompt or DEFAULT_PROMPT
        self._session = session
        self._own_session = session is None

    def request_body(self, image_url: str) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": self.prompt},
                        {"type": "image_url", "image_url": {"url": image_url}},
                    ],
                }
            ],
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": False,
        }

    async def describe(self, image_url: str) -> str:
        """The model's description of the image at `image_url` (a `data:` URI or a URL the model can fetch)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
            self._own_session = True
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with self._session.post(self.url, json=self.request_body(image_url), headers=headers,
                                          timeout=self.timeout) as r:
                if r.status != 200:
                    raise VisionError(f"vision model answered HTTP {r.status}: {(await r.text())[:200]}")
                body = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise VisionError(f"vision model call failed: {exc}") from exc
        try:
            text = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise VisionError("vision model answer has no choices[0].message.content") from None
        if isinstance(text, list):  # content parts
            text = " ".join(p.get("text", "") for p in text if isinstance(p, dict))
        text = " ".join(str(text or "").split())
        if not text:
            raise VisionError("vision model gave an empty description")
        return text

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None
