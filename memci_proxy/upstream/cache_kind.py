"""What kind of prefix cache the upstream keeps: many prefixes (a radix tree: SGLang, vLLM, OpenAI, DeepSeek) or
one per slot (llama.cpp's server, llama-cpp-python's: each request replaces the slot's prefix).

It matters to background work: a memory job sent after a turn's answer evicts the live conversation's prefix from
a one-slot engine (its next turn prefills from the start), while a radix engine keeps both. The setting
``upstream_cache`` says which (``radix`` | ``single_slot``); ``auto`` (the default) asks the upstream once:
- llama-cpp-python's server: ``GET /openapi.json`` titled "llama.cpp Python API";
- llama.cpp's server: ``GET /props`` with ``default_generation_settings`` (its slots each hold one prompt, and a
  job resembling the conversation's prompt is given the conversation's own slot).
Anything else, or no answer, is taken for a radix cache (asked again after ``RETRY_S`` when the upstream could not
be reached).
"""

from __future__ import annotations

import asyncio
import logging

from memci_proxy.upstream.engine_id import RADIX, SINGLE_SLOT, engine_of, root_of
from memci_proxy.upstream.port import Upstream

log = logging.getLogger("memci.upstream")
__all__ = ["RADIX", "SINGLE_SLOT", "CacheKind", "kind_of"]
RETRY_S = 600.0


def kind_of(path: str, status: int, body: bytes) -> str | None:
    """The cache kind one probe's answer shows (None: this probe does not tell): a one-slot engine, by
    memci_proxy.upstream.engine_id's reading of it."""
    engine = engine_of(path, status, body)
    return SINGLE_SLOT if engine is not None and engine.cache == SINGLE_SLOT else None


class CacheKind:
    def __init__(self, setting: str, upstream: Upstream) -> None:
        self.setting = setting
        self.upstream = upstream
        self._kind: str | None = None if setting == "auto" else setting
        self._next_try = 0.0
        self._lock = asyncio.Lock()

    async def single_slot(self) -> bool:
        return await self.kind() == SINGLE_SLOT

    async def kind(self) -> str:
        if self._kind is not None:
            return self._kind
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_try:
            return RADIX
        async with self._lock:
            if self._kind is None and loop.time() >= self._next_try:
                self._kind = await self._detect()
                if self._kind is None:
                    self._next_try = loop.time() + RETRY_S
        return self._kind or RADIX

    async def _detect(self) -> str | None:
        reached = False
        for path in ("/props", "/openapi.json"):
            try:
                response, _ = await self.upstream.send("GET", root_of(str(self.upstream.url(""))) + path, {}, None)
                body = await self.upstream.read_body(response)
            except Exception:
                continue
            reached = True
            kind = kind_of(path, response.status, body)
            if kind is not None:
                log.info("the upstream keeps one prompt per cache slot (%s): memory jobs run before an epoch's "
                         "request, on the prefix the slot holds", path)
                return kind
        return RADIX if reached else None
