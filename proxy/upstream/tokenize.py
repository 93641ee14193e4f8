"""Exact text counts from the upstream's own tokenizer: SGLang's and vLLM's `POST /tokenize`.

Both serve it at the server root (next to `/v1`): `{"model", "prompt": "<text>", "add_special_tokens": false}`
-> `{"tokens": [...], "count": N, "max_model_len": M}`. An upstream without it (404, 405, an error) turns it
off for `RETRY_AFTER_S`; counting then falls back to the estimate.

The engine counts synchronously, so `UpstreamTokenCounter.count_text` answers from a bounded cache keyed by the
text's xxh3 hash, and on a miss with the estimate scaled by the ratio of exact to estimated counts of the texts
the upstream counted so far (so every count is in the upstream's units). A turn asks `prefetch` for its new
texts first, waiting at most `timeout` seconds, and only when the texts not cached yet are long (`wait_min_chars`:
a short user message's estimate is off by a token or two, a tool result's by hundreds); answers that come later
still fill the cache for the next turns (the same messages come back with every request), so a turn of a chat
does not wait for the tokenizer at all.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import msgspec
import xxhash

from proxy.caches import BoundedLru
from proxy.engine.tokens import MESSAGE_OVERHEAD, IMAGE_TOKENS, EstimateCounter, TokenCounter, message_texts
from proxy.upstream.port import Upstream

log = logging.getLogger("memci.tokenize")
RETRY_AFTER_S = 600.0
MIN_CHARS = 16  # shorter texts are not worth a request: the estimate is within a token or two
MAX_CONCURRENT = 8
RATIO_DECAY = 0.98  # the exact/estimate ratio follows about the last 50 texts counted
_encode = msgspec.json.Encoder().encode


def tokenize_url(upstream: Upstream) -> str:
    """`/tokenize` at the upstream's root: the OpenAI base URL without its trailing `/v1`."""
    base = str(upstream.url("")).rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/tokenize"


class UpstreamTokenCounter:
    """A TokenCounter: the upstream's counts where cached, the estimate otherwise (see the module docstring)."""

    def __init__(self, upstream: Upstream, max_entries: int = 20000, timeout: float = 0.2,
                 metrics: Any = None, base: TokenCounter | None = None, clock: Any = time.monotonic,
                 wait_min_chars: int = 0) -> None:
        self.upstream = upstream
        self.base = base or EstimateCounter()
        self.max_entries = max(1, max_entries)
        self.timeout = timeout
        self.wait_min_chars = max(0, wait_min_chars)
        self.metrics = metrics
        self.clock = clock
        self.model = ""
        self._cache: BoundedLru[int, int] = BoundedLru("upstream_token_counts", self.max_entries)
        self._inflight: dict[int, asyncio.Task[None]] = {}
        self._off_until = 0.0
        self._gate = asyncio.Semaphore(MAX_CONCURRENT)
        self.hits = self.misses = 0
        self._exact_sum = self._estimate_sum = 0.0

    @property
    def ratio(self) -> float:
        """Exact tokens per estimated token, over the texts the upstream counted (1 before any)."""
        if self._estimate_sum <= 0:
            return 1.0
        return min(4.0, max(0.25, self._exact_sum / self._estimate_sum))

    # -- the TokenCounter protocol ------------------------------------------------------------------------------
    def lookup(self, text: str) -> int | None:
        """The upstream's count of a text when cached (None: not known, the estimate would serve)."""
        if len(text) < MIN_CHARS:
            return None
        return self._cache.peek(self._key(text))

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        if len(text) >= MIN_CHARS:
            count = self._cache.peek(self._key(text))
            if count is not None:
                self.hits += 1
                return count
            self.misses += 1
        estimate = self.base.count_text(text)
        return math.ceil(estimate * self.ratio) if estimate else 0

    def count_message(self, message: dict[str, Any]) -> int:
        texts, others = message_texts(message)
        return MESSAGE_OVERHEAD + others * IMAGE_TOKENS + sum(self.count_text(t) for t in texts)

    # -- filling the cache ---------------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self.clock() >= self._off_until

    def __len__(self) -> int:
        return len(self._cache)

    def _key(self, text: str) -> int:
        return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))

    async def prefetch(self, texts: Iterable[str], model: str = "", timeout: float | None = None) -> None:
        """Ask the upstream for the texts not cached yet; wait at most `timeout` (the rest finish in the background)."""
        if not self.available:
            return
        if model:
            self.model = model
        tasks: list[asyncio.Task[None]] = []
        uncounted = 0
        for text in texts:
            if not text or len(text) < MIN_CHARS:
                continue
            key = self._key(text)
            if key in self._cache:
                continue
            task = self._inflight.get(key)
            if task is None:
                task = self._inflight[key] = asyncio.get_running_loop().create_task(self._fetch(key, text))
                task.add_done_callback(lambda _t, k=key: self._inflight.pop(k, None))
            tasks.append(task)
            uncounted += len(text)
        if not tasks or (timeout is None and uncounted < self.wait_min_chars):
            return  # short new texts: counted behind the turn (an explicit timeout always waits)
        wait = self.timeout if timeout is None else timeout
        if wait > 0:
            await asyncio.wait(tasks, timeout=wait)

    async def _fetch(self, key: int, text: str) -> None:
        async with self._gate:
            if not self.available:
                return
            count = await self._ask(text)
        if count is not None:
            estimate = self.base.count_text(text)
            if estimate > 0:
                self._exact_sum = RATIO_DECAY * self._exact_sum + count
                self._estimate_sum = RATIO_DECAY * self._estimate_sum + estimate
            self._cache.put(key, count)

    async def _ask(self, text: str) -> int | None:
        body: dict[str, Any] = {"prompt": text, "add_special_tokens": False}
        if self.model:
            body["model"] = self.model
        try:
            response, _ = await self.upstream.send("POST", tokenize_url(self.upstream),
                                                   {**self.upstream.forward_headers({}),
                                                    "Content-Type": "application/json"}, _encode(body))
            status = response.status
            content = await self.upstream.read_body(response)
            if status != 200:
                self._off(f"status {status}")
                return None
            data = msgspec.json.decode(content)
            count = data.get("count") if isinstance(data, dict) else None
            if not isinstance(count, int):
                tokens = data.get("tokens") if isinstance(data, dict) else None
                count = len(tokens) if isinstance(tokens, list) else None
            if not isinstance(count, int) or count < 0:
                self._off("no count in the answer")
                return None
            self._outcome("ok")
            return count
        except Exception as exc:  # down, slow, malformed: the estimate serves meanwhile
            self._off(type(exc).__name__)
            return None

    def _off(self, why: str) -> None:
        if self.available:
            log.info("the upstream's /tokenize is not usable (%s); estimating counts for %.0f s", why, RETRY_AFTER_S)
        self._off_until = self.clock() + RETRY_AFTER_S
        self._outcome("unavailable")

    def _outcome(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.tokenize_requests.labels(outcome).inc()

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
