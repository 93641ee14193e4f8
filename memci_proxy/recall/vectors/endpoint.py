"""Client of an OpenAI-compatible embeddings endpoint: ``POST {base_url}/embeddings`` with a batch of inputs.

The dimension is learned from the first answer; a later answer of another dimension is a failure (the
stored vectors could not be compared with it). Every failure (connection, time-out, HTTP status, malformed
answer) returns ``None`` and sets ``last_failure`` to a short reason, so that the caller searches lexically
and counts a fallback; the client never raises for the endpoint's faults.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import struct
from collections.abc import Sequence
from typing import Any

import aiohttp

log = logging.getLogger("memci.recall")

__all__ = ["EmbeddingsClient", "embeddings_endpoint"]


def embeddings_endpoint(base_url: str) -> str:
    """The embeddings URL of an OpenAI base URL (``http://host/v1`` -> ``http://host/v1/embeddings``);
    a URL that already ends with ``/embeddings`` is kept."""
    url = base_url.strip().rstrip("/")
    return url if url.endswith("/embeddings") else url + "/embeddings"


def _decode_embedding(value: Any) -> list[float]:
    if isinstance(value, str):  # encoding_format "base64": little-endian float32
        raw = base64.b64decode(value)
        if len(raw) % 4:
            raise ValueError("base64 embedding is not a float32 array")
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    if not isinstance(value, list) or not value:
        raise ValueError("embedding is not a non-empty array")
    vector = [float(x) for x in value]
    if not all(math.isfinite(x) for x in vector):
        raise ValueError("embedding has non-finite values")
    return vector


class EmbeddingsClient:
    """``await client.embed(texts)`` -> one vector per text, in order, or ``None`` on any failure."""

    def __init__(
        self,
        base_url: str,
        model: str = "",
        timeout_s: float = 10.0,
        api_key: str = "",
        batch_size: int = 64,
        max_chars: int = 4000,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        """``base_url``: an OpenAI base URL (the upstream's ``.../v1`` or another server's).
        ``model``: sent as ``model`` (empty: "default", and the answer's ``model`` names the vectors).
        ``max_chars``: each input is cut to that many characters (embedding models read a few hundred
        tokens; the page's head carries most of what it is about)."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.endpoint = embeddings_endpoint(base_url)
        self.model = model
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.api_key = api_key
        self.batch_size = batch_size
        self.max_chars = max_chars
        self.dimension: int | None = None
        self.answered_model: str | None = None
        self.last_failure: str | None = None
        self._session = session
        self._own_session = session is None

    @property
    def model_name(self) -> str:
        """The name vectors are stored under: the configured model, else "default" (stable across restarts;
        configure the model's name so that changing the model re-embeds the pages)."""
        return self.model or "default"

    async def embed(self, texts: Sequence[str]) -> list[list[float]] | None:
        if not texts:
            return []
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = [self._clip(t) for t in texts[start : start + self.batch_size]]
            got = await self._request(chunk)
            if got is None:
                return None
            vectors.extend(got)
        self.last_failure = None
        return vectors

    def _clip(self, text: str) -> str:
        text = text if text.strip() else "(empty)"  # servers reject empty inputs
        return text[: self.max_chars] if self.max_chars > 0 else text

    async def _request(self, inputs: list[str]) -> list[list[float]] | None:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = {"model": self.model or "default", "input": inputs, "encoding_format": "float"}
        try:
            session = self._session_now()
            async with session.post(self.endpoint, json=body, headers=headers, timeout=self.timeout) as response:
                if response.status != 200:
                    return self._fail(f"http_{response.status}", f"{self.endpoint} answered {response.status}")
                payload = await response.json(content_type=None)
        except asyncio.TimeoutError:
            return self._fail("timeout", f"{self.endpoint} did not answer in {self.timeout.total} s")
        except aiohttp.ClientError as exc:
            return self._fail("unreachable", f"{self.endpoint}: {exc!r}")
        except ValueError as exc:  # the body is not JSON
            return self._fail("bad_answer", f"{self.endpoint}: {exc}")
        try:
            vectors = self._parse(payload, len(inputs))
        except (ValueError, TypeError, KeyError) as exc:
            return self._fail("bad_answer", f"{self.endpoint}: {exc}")
        return vectors

    def _parse(self, payload: Any, expected: int) -> list[list[float]]:
        data = payload["data"]
        if not isinstance(data, list) or len(data) != expected:
            raise ValueError(f"{len(data) if isinstance(data, list) else 'no'} embeddings for {expected} inputs")
        ordered = sorted(data, key=lambda item: item.get("index", 0))
        vectors = [_decode_embedding(item["embedding"]) for item in ordered]
        dims = {len(v) for v in vectors}
        if len(dims) != 1:
            raise ValueError(f"embeddings of several dimensions {sorted(dims)}")
        dim = dims.pop()
        if self.dimension is None:
            self.dimension = dim
            log.info("embeddings from %s: dimension %d", self.endpoint, dim)
        elif dim != self.dimension:
            raise ValueError(f"dimension {dim} differs from the {self.dimension} learned first")
        if isinstance(payload.get("model"), str) and payload["model"]:
            self.answered_model = self.answered_model or payload["model"]
        return vectors

    def _fail(self, reason: str, detail: str) -> None:
        if self.last_failure != reason:
            log.warning("embeddings unavailable (%s): %s; recall search is lexical only meanwhile", reason, detail)
        self.last_failure = reason
        return None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
            self._own_session = True
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None and not self._session.closed:
            await self._session.close()
