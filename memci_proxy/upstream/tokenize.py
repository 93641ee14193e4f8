"""Exact text counts from the upstream's own tokenizer: SGLang's and vLLM's `POST /tokenize`, llama-cpp-python's
`POST /extras/tokenize/count`.

Both serve it at the server root (next to `/v1`): `{"model", "prompt": "<text>", "add_special_tokens": false}`
-> `{"tokens": [...], "count": N, "max_model_len": M}`. SGLang (and the emulator) also take a list of texts
(`"prompt": [...]` -> `"count": [N, ...]`): a turn's new texts go in one request; an upstream that refuses the
list (vLLM: 400 or 422) is asked one text per request from then on. An upstream whose `/tokenize` is not found (404,
405) is asked at llama-cpp-python's `/extras/tokenize/count` (`{"input": "<text>"}` -> `{"count": N}`, one text per
request) and, when that answers, there from then on. An upstream with neither (or an error) turns counting off for
`RETRY_AFTER_S`; counting then falls back to the estimate.

The engine counts synchronously, so `UpstreamTokenCounter.count_text` answers from a bounded cache keyed by the
text's xxh3 hash, and on a miss with the estimate scaled by the ratio of exact to estimated counts of the texts
the upstream counted so far (so every count is in the upstream's units). Texts shorter than `min_chars` are not
asked at all (their estimate is off by a few tokens, which the learned costs and the safety margin absorb). A turn
asks `prefetch` for its new texts first, waiting at most `timeout` seconds, and only when the texts not cached
yet are long (`wait_min_chars`: a short user message's estimate is off by a token or two, a tool result's by
hundreds); answers that come later still fill the cache for the next turns (the same messages come back with
every request), so a turn of a chat does not wait for the tokenizer at all. Texts no turn waits for are gathered
for `GATHER_S` (the new messages of the other conversations' turns meanwhile) and asked in one request: under
load, one request counts the texts of several turns instead of one each.
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

from memci_proxy.caches import BoundedLru
from memci_proxy.engine.tokens import MESSAGE_OVERHEAD, IMAGE_TOKENS, EstimateCounter, TokenCounter, message_texts
from memci_proxy.upstream.engine_id import root_of
from memci_proxy.upstream.port import Upstream

log = logging.getLogger("memci.tokenize")
RETRY_AFTER_S = 600.0
MIN_CHARS = 16  # the least `min_chars`: shorter texts are never worth a request
MAX_CONCURRENT = 8
MAX_BATCH = 64  # texts per request when the upstream takes lists
GATHER_S = 0.01  # texts no turn waits for wait this long for others to share their request
COUNT_ITEM_BYTES = 160  # one cached count: two ints and the map's slot
RATIO_DECAY = 0.98  # the exact/estimate ratio follows about the last 50 texts counted
REFUSES_LISTS = (400, 422)  # vLLM's answer to a list of prompts: one text per request from then on
_encode = msgspec.json.Encoder().encode


EXTRAS = "/extras/tokenize/count"  # llama-cpp-python's server
NOT_FOUND = (404, 405)


def text_key(text: str) -> int:
    """A text's key in the count cache: the 64-bit xxh3 of its UTF-8 (lone surrogates kept)."""
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


def tokenize_url(upstream: Upstream, path: str = "/tokenize") -> str:
    """`/tokenize` (or `path`) at the upstream's root: the OpenAI base URL without its trailing `/v1`."""
    return root_of(str(upstream.url(""))) + path


class UpstreamTokenCounter:
    """A TokenCounter: the upstream's counts where cached, the estimate otherwise (see the module docstring)."""

    def __init__(self, upstream: Upstream, max_entries: int = 20000, timeout: float = 0.2,
                 metrics: Any = None, base: TokenCounter | None = None, clock: Any = time.monotonic,
                 wait_min_chars: int = 0, min_chars: int = MIN_CHARS) -> None:
        self.upstream = upstream
        self.base = base or EstimateCounter()
        self.max_entries = max(1, max_entries)
        self.timeout = timeout
        self.wait_min_chars = max(0, wait_min_chars)
        self.min_chars = max(MIN_CHARS, min_chars)
        self.metrics = metrics
        self.clock = clock
        self.model = ""
        self._cache: BoundedLru[int, int] = BoundedLru(  # a text's 64-bit hash -> its count: fixed-size items
            "upstream_token_counts", self.max_entries, self.max_entries * COUNT_ITEM_BYTES,
            size_of=lambda _k, _v: COUNT_ITEM_BYTES)
        self._inflight: dict[int, asyncio.Task[None]] = {}
        self._gathering: dict[str, _Gathering] = {}  # model -> the texts waiting for others to share their request
        self.gather_s = GATHER_S
        self._off_until = 0.0
        self._gate = asyncio.Semaphore(MAX_CONCURRENT)
        self._lists = True  # the upstream takes a list of texts (until it refuses one)
        self._path = "/tokenize"  # EXTRAS once /tokenize was not found and it answered
        self._path_known = False  # a count came back from `_path`
        self.hits = self.misses = 0
        self.counted = 0  # texts this process has counted exactly (asked, or an answer's completion tokens)
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
        if len(text) < self.min_chars:
            return None
        return self._cache.peek(self._key(text))

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        if len(text) >= self.min_chars:
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
    def remember(self, text: str, count: int) -> None:
        """A text the upstream counted otherwise (an answer's completion tokens): cached, and taken into the
        exact/estimate ratio, like a /tokenize count, so the text is not asked for when the client sends it back."""
        if len(text) >= self.min_chars and count >= 0:
            key = self._key(text)
            if key not in self._cache:
                self._counted(key, text, count)

    @property
    def available(self) -> bool:
        return self.clock() >= self._off_until

    def __len__(self) -> int:
        return len(self._cache)

    def _key(self, text: str) -> int:
        return text_key(text)

    async def prefetch(self, texts: Iterable[str], model: str = "", timeout: float | None = None) -> None:
        """Ask the upstream for the texts not cached yet, in one request; wait at most `timeout` (the rest finish
        in the background)."""
        if not self.available:
            return
        if model:
            self.model = model
        tasks: set[asyncio.Task[None]] = set()
        asked: dict[int, str] = {}
        uncounted = 0
        for text in texts:
            if not text or len(text) < self.min_chars:
                continue
            key = self._key(text)
            if key in self._cache or key in asked:
                continue
            task = self._inflight.get(key)
            if task is None:
                asked[key] = text
            else:
                tasks.add(task)
            uncounted += len(text)
        for key, text in asked.items():
            tasks.add(self._gather(key, text, self.model))
        if not tasks or (timeout is None and uncounted < self.wait_min_chars):
            return  # short new texts: counted behind the turn (an explicit timeout always waits)
        for gathering in self._gathering.values():
            if gathering.task in tasks:
                gathering.now.set()  # a turn waits for it: asked now, with what was gathered so far
        wait = self.timeout if timeout is None else timeout
        if wait > 0:
            await asyncio.wait(tasks, timeout=wait)

    def _gather(self, key: int, text: str, model: str) -> asyncio.Task[None]:
        """The request that will count the text: the one gathering the model's texts now, or a new one (sent after
        `gather_s`, or at once when full)."""
        gathering = self._gathering.get(model)
        if gathering is None:
            gathering = self._gathering[model] = _Gathering(model)
            loop = asyncio.get_running_loop()
            gathering.task = loop.create_task(self._send_gathered(gathering))
            gathering.task.add_done_callback(lambda _t, g=gathering: self._landed(tuple(g.texts)))
            loop.call_later(self.gather_s, gathering.now.set)
        gathering.texts[key] = text
        self._inflight[key] = gathering.task
        if len(gathering.texts) >= MAX_BATCH:
            self._sent(gathering)
            gathering.now.set()
        return gathering.task

    def _sent(self, gathering: _Gathering) -> None:
        if self._gathering.get(gathering.model) is gathering:
            del self._gathering[gathering.model]

    async def _send_gathered(self, gathering: _Gathering) -> None:
        await gathering.now.wait()
        self._sent(gathering)
        await self._fetch(gathering.texts, gathering.model)

    def _landed(self, keys: tuple[int, ...]) -> None:
        for key in keys:
            self._inflight.pop(key, None)

    async def _fetch(self, texts: dict[int, str], model: str = "") -> None:
        async with self._gate:
            if not self.available:
                return
            if len(texts) > 1 and self._lists:
                counts = await self._ask(list(texts.values()), model)
                if counts is None and self.available and not self._lists:  # refused: one text per request
                    counts = [await self._ask(text, model) for text in texts.values()]
            else:
                counts = [await self._ask(text, model) for text in texts.values()]
        for (key, text), count in zip(texts.items(), counts or ()):
            if isinstance(count, int):
                self._counted(key, text, count)

    def _counted(self, key: int, text: str, count: int) -> None:
        self.counted += 1
        estimate = self.base.count_text(text)
        if estimate > 0:
            self._exact_sum = RATIO_DECAY * self._exact_sum + count
            self._estimate_sum = RATIO_DECAY * self._estimate_sum + estimate
        self._cache.put(key, count)

    async def _ask(self, prompt: str | list[str], model: str = "") -> Any:
        """The count of one text (an int), or of a list of texts (a list of ints); None when not counted."""
        if not self.available:
            return None
        many = isinstance(prompt, list)
        extras = self._path == EXTRAS
        if many and extras:
            self._lists = False
            return None
        body: dict[str, Any] = {"input": prompt} if extras else {"prompt": prompt, "add_special_tokens": False}
        if model and not extras:  # llama-cpp-python's names are its aliases: its default model serves
            body["model"] = model
        try:
            response, _ = await self.upstream.send("POST", tokenize_url(self.upstream, self._path),
                                                   {**self.upstream.forward_headers({}),
                                                    "Content-Type": "application/json"}, _encode(body))
            status = response.status
            content = await self.upstream.read_body(response)
            if status in NOT_FOUND and not self._path_known and not extras:
                self._path = EXTRAS  # llama-cpp-python's route, asked once; off (below) if it is not there either
                return await self._ask(prompt, model)
            if many and status in REFUSES_LISTS:
                self._lists = False
                return None
            if status != 200:
                self._off(f"status {status}")
                return None
            data = msgspec.json.decode(content)
            count = _counts(data, len(prompt)) if many else count_of(data)
            if count is None and many:  # an answer of another shape: one text per request from now on
                self._lists = False
                return None
            if count is None:
                self._off("no count in the answer")
                return None
            self._path_known = True
            self._outcome("ok")
            return count
        except Exception as exc:  # down, slow, malformed: the estimate serves meanwhile
            self._off(type(exc).__name__)
            return None

    def _off(self, why: str) -> None:
        if not self._path_known:
            self._path = "/tokenize"  # asked again from the start after the pause
        if self.available:
            log.info("the upstream's /tokenize is not usable (%s); estimating counts for %.0f s", why, RETRY_AFTER_S)
        self._off_until = self.clock() + RETRY_AFTER_S
        self._outcome("unavailable")

    def _outcome(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.child(self.metrics.tokenize_requests, outcome).inc()

    async def close(self) -> None:
        for task in list(self._inflight.values()):
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)


class _Gathering:
    """Texts of one model asked in one request, and its task; `now` is set when it is to be sent."""

    __slots__ = ("model", "texts", "task", "now")

    def __init__(self, model: str) -> None:
        self.model = model
        self.texts: dict[int, str] = {}
        self.task: asyncio.Task[None]
        self.now = asyncio.Event()


def count_of(data: Any) -> int | None:
    """The count of one text in a /tokenize answer: `count`, else the length of `tokens`."""
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if not isinstance(count, int):
        tokens = data.get("tokens")
        count = len(tokens) if isinstance(tokens, list) else None
    return count if isinstance(count, int) and count >= 0 else None


def _counts(data: Any, n: int) -> list[int] | None:
    """The counts of `n` texts asked as a list: `count` as a list, else the lengths of `tokens`' lists."""
    if not isinstance(data, dict):
        return None
    counts = data.get("count")
    if not isinstance(counts, list):
        tokens = data.get("tokens")
        counts = [len(t) if isinstance(t, list) else None for t in tokens] if isinstance(tokens, list) else None
    if counts is None or len(counts) != n or not all(isinstance(c, int) and c >= 0 for c in counts):
        return None
    return counts
