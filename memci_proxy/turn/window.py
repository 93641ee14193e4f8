"""The model's context window: the setting, else the upstream's (/v1/models max_model_len, or llama.cpp's /props
n_ctx), else 32k; and it follows the upstream.

The upstream can be restarted with another window while the proxy runs. So a learned window is asked again every
``REFRESH_S`` (in the background: no turn waits for it), and when the upstream refuses a prompt as too long
(``refused``), the window is read again at once (/v1/models, else the number the error states, else three quarters of
the window the turn was planned with); a smaller one replaces the learned value, and a setting larger than it: the
turn is then planned again and sent once more (``memci_proxy.turn.service``).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from memci_proxy.settings import Settings
from memci_proxy.upstream.port import Upstream

log = logging.getLogger("memci.context")
FALLBACK_WINDOW = 32768
_RETRY_AFTER_S = 60.0
REFRESH_S = 300.0  # a learned window is asked again this often
MIN_WINDOW = 256


class ContextWindow:
    def __init__(self, settings: Settings, upstream: Upstream) -> None:
        self.settings = settings
        self.upstream = upstream
        self._learned: int | None = None
        self._refused: int | None = None  # the window an upstream's refusal taught (caps the setting too)
        self._next_try = 0.0
        self._next_refresh = 0.0
        self._refreshing: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def tokens(self) -> int:
        window = await self._configured()
        return min(window, self._refused) if self._refused else window

    async def _configured(self) -> int:
        if self.settings.context_window:
            return self.settings.context_window
        loop = asyncio.get_running_loop()
        if self._learned is not None:
            if loop.time() >= self._next_refresh and self._refreshing is None:
                self._next_refresh = loop.time() + REFRESH_S
                self._refreshing = loop.create_task(self._refresh())
            return self._learned
        if loop.time() < self._next_try:
            return FALLBACK_WINDOW
        async with self._lock:
            if self._learned is None and loop.time() >= self._next_try:
                self._learned = await self._ask()
                if self._learned is None:
                    self._next_try = loop.time() + _RETRY_AFTER_S
                else:
                    self._next_refresh = loop.time() + REFRESH_S
        return self._learned or FALLBACK_WINDOW

    async def _refresh(self) -> None:
        try:
            value = await self._ask(quiet=True)
            if value is not None and value != self._learned:
                log.warning("the upstream's context window changed: %s -> %d tokens", self._learned, value)
                self._learned = value
                if self._refused and value > self._refused:
                    self._refused = None  # the upstream says more now (it was restarted with a larger one)
        finally:
            self._refreshing = None

    async def refused(self, stated: int | None, planned: int) -> int | None:
        """The upstream refused a prompt planned for a window of ``planned`` tokens as too long (``stated``: the
        window its error names). Returns the smaller window to plan again with, None when there is none."""
        asked = None if self.settings.context_window else await self._ask(quiet=True)
        window = asked or stated or max(MIN_WINDOW, planned * 3 // 4)
        if window >= planned:
            return None
        log.warning("the upstream refused a prompt as too long: its context window is now %d tokens (was %d)",
                    window, planned)
        if asked:
            self._learned = asked
        self._refused = window
        return window

    async def _ask(self, quiet: bool = False) -> int | None:
        try:
            value, llama_cpp = await self._models()
            if value is None and llama_cpp:
                value = await self._props()
            if value is not None and not quiet:
                log.info("context window learned from the upstream: %d tokens", value)
            return value
        except Exception as exc:  # the upstream may be down at start; fall back and retry later
            if not quiet:
                log.warning("could not learn the context window from the upstream (%s); using %d", exc,
                            FALLBACK_WINDOW)
        return None

    async def _models(self) -> tuple[int | None, bool]:
        """The window /v1/models states, and whether the server is llama.cpp's (owned_by "llamacpp")."""
        response, _ = await self.upstream.send("GET", self.upstream.url("/models"), {}, None)
        body = await self.upstream.read_body(response)
        data = msgspec.json.decode(body)
        llama_cpp = False
        for model in data.get("data", []):
            llama_cpp = llama_cpp or model.get("owned_by") == "llamacpp"
            value = model.get("max_model_len") or model.get("context_length") or model.get("max_context_length")
            if isinstance(value, int) and value > 0:
                return value, llama_cpp
        return None, llama_cpp

    async def _props(self) -> int | None:
        """llama.cpp's server: GET /props (at the root) -> default_generation_settings.n_ctx."""
        base = str(self.upstream.url("")).rstrip("/")
        base = base[: -len("/v1")] if base.endswith("/v1") else base
        response, _ = await self.upstream.send("GET", base + "/props", {}, None)
        body = await self.upstream.read_body(response)
        if response.status != 200:
            return None
        data = msgspec.json.decode(body)
        settings = data.get("default_generation_settings") if isinstance(data, dict) else None
        value = settings.get("n_ctx") if isinstance(settings, dict) else None
        return value if isinstance(value, int) and value > 0 else None
