"""The upstream's /tokenize as a token counter (proxy.upstream.tokenize), over httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest
from turn_fakes import MockUpstream

from proxy.engine.tokens import EstimateCounter
from proxy.upstream.tokenize import RETRY_AFTER_S, UpstreamTokenCounter, tokenize_url

TEXT = "The quick brown fox jumps over the lazy dog, twice."


class Tokenizer:
    """An SGLang/vLLM-like /tokenize: one token per word; can be slow or missing."""

    def __init__(self, status: int = 200, delay: float = 0.0) -> None:
        self.status, self.delay, self.bodies = status, delay, []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/tokenize", request.url  # at the server root, not under /v1
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.status != 200:
            return httpx.Response(self.status, json={"detail": "Not Found"})
        tokens = list(range(len(body["prompt"].split())))
        return httpx.Response(200, json={"tokens": tokens, "count": len(tokens), "max_model_len": 8192})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_tokenize_url_is_at_the_root():
    assert tokenize_url(MockUpstream(Tokenizer())) == "http://upstream.test/tokenize"


async def test_counts_come_from_the_upstream_once_cached():
    server = Tokenizer()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    assert counter.count_text(TEXT) == EstimateCounter().count_text(TEXT)  # not asked yet: the estimate
    await counter.prefetch([TEXT, "short"], model="m")
    assert counter.count_text(TEXT) == 10
    assert server.bodies == [{"prompt": TEXT, "add_special_tokens": False, "model": "m"}]  # short texts not asked
    await counter.prefetch([TEXT])
    assert len(server.bodies) == 1  # cached by the text's hash


async def test_a_slow_tokenizer_does_not_hold_the_turn():
    server = Tokenizer(delay=0.3)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=0.02)
    started = asyncio.get_running_loop().time()
    await counter.prefetch([TEXT])
    assert asyncio.get_running_loop().time() - started < 0.25
    assert counter.count_text(TEXT) == EstimateCounter().count_text(TEXT)  # meanwhile: the estimate
    await asyncio.sleep(0.4)
    assert counter.count_text(TEXT) == 10  # the late answer fills the cache for the next turn
    await counter.close()


async def test_an_upstream_without_tokenize_falls_back_and_retries_later():
    server, clock = Tokenizer(status=404), Clock()
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0, clock=clock)
    await counter.prefetch([TEXT])
    assert not counter.available and counter.count_text(TEXT) == EstimateCounter().count_text(TEXT)
    await counter.prefetch([TEXT + " again"])
    assert len(server.bodies) == 1  # off: no more requests
    clock.now += RETRY_AFTER_S
    server.status = 200
    await counter.prefetch([TEXT])
    assert counter.available and counter.count_text(TEXT) == 10


async def test_the_cache_is_bounded():
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer()), max_entries=3, timeout=1.0)
    texts = [f"{TEXT} number {i}" for i in range(6)]
    await counter.prefetch(texts)
    assert len(counter) == 3
    assert counter.lookup(texts[-1]) == 12 and counter.lookup(texts[0]) is None  # the oldest left the cache


async def test_misses_are_estimated_in_the_upstreams_units():
    """Once some texts were counted, a text not asked yet is estimated times the exact/estimate ratio seen."""
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer()), timeout=1.0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 3  # 30 words: 30 tokens
    await counter.prefetch([words])
    estimate = EstimateCounter().count_text(words)
    assert counter.ratio == pytest.approx(30 / estimate)
    unseen = "lambda mu nu xi omicron pi rho sigma tau upsilon " * 3
    assert counter.count_text(unseen) == math.ceil(EstimateCounter().count_text(unseen) * 30 / estimate)


def test_the_turn_counts_with_the_upstream_tokenizer_unless_a_file_is_set():
    from proxy.metrics import Metrics
    from proxy.settings import Settings
    from proxy.turn.counting import TurnCounts

    upstream = MockUpstream(Tokenizer())
    assert isinstance(TurnCounts(Settings(), upstream, Metrics()).base, UpstreamTokenCounter)  # empty cache too
    assert isinstance(TurnCounts(Settings(upstream_tokenize=False), upstream, Metrics()).base, EstimateCounter)


async def test_short_new_texts_are_counted_behind_the_turn_and_long_ones_waited_for():
    server = Tokenizer(delay=0.05)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0, wait_min_chars=200)
    await counter.prefetch([TEXT])  # 51 characters: the turn goes on with the estimate
    assert counter.lookup(TEXT) is None
    await asyncio.sleep(0.15)
    assert counter.lookup(TEXT) == 10  # counted behind it, for the next turns
    long_text = "word " * 100
    await counter.prefetch([long_text])  # 500 characters: worth the wait
    assert counter.lookup(long_text) == 100
    await counter.close()
