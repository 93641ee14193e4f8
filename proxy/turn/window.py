"""The model's context window: the setting, else the upstream's /v1/models max_model_len, else 32k."""

from __future__ import annotations

import asyncio
import logging

import msgspec

from proxy.settings import Settings
from proxy.upstream.port import Upstream

log = logging.getLogger("memci.context")
FALLBACK_WINDOW = 32768
_RETRY_AFTER_S = 60.0


class ContextWindow:
    def __init__(self, settings: Settings, upstream: Upstream) -> None:
        self.settings = settings
        self.upstream = upstream
        self._learned: int | None = None
        self._next_try = 0.0
        self._lock = asyncio.Lock()

    async def tokens(self) -> int:
        if self.settings.context_window:
            return self.settings.context_window
        if self._learned is not None:
            return self._learned
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_try:
            return FALLBACK_WINDOW
        async with self._lock:
            if self._learned is None and loop.time() >= self._next_try:
                self._learned = await self._ask()
                if self._learned is None:
                    self._next_try = loop.time() + _RETRY_AFTER_S
        return self._learned or FALLBACK_WINDOW

    async def _ask(self) -> int | None:
        try:
            response, _ = await self.upstream.send("GET", self.upstream.url("/models"), {}, None)
            body = await self.upstream.read_body(response)
            data = msgspec.json.decode(body)
            for model in data.get("data", []):
                value = model.get("max_model_len") or model.get("context_length") or model.get("max_context_length")
                if isinstance(value, int) and value > 0:
                    log.info("context window learned from the upstream: %d tokens", value)
                    return value
        except Exception as exc:  # the upstream may be down at start; fall back and retry later
            log.warning("could not learn the context window from the upstream (%s); using %d", exc, FALLBACK_WINDOW)
        return None
