"""The model level against the upstream emulator in a subprocess: answers, slowness and faults.

A slow rewrite model must not hold the request: the rules serve within the timeout plus 50 ms.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest

from memci_proxy.emulator.testing import running_emulator
from memci_proxy.rewrite import LEVEL_MODEL, LEVEL_RULES, ModelRewriter, rewrite

HISTORY = [{"role": "user", "content": "Tell me about the Python GIL."}]
TIMEOUT_S = 0.3


@pytest.fixture(scope="module")
def emulator_url() -> Iterator[str]:
    with running_emulator() as url:
        yield url


@pytest.fixture
async def client(emulator_url: str) -> AsyncIterator[ModelRewriter]:
    async with ModelRewriter(emulator_url, "rewrite-model", timeout_s=TIMEOUT_S) as rewriter:
        yield rewriter


async def test_model_answer_serves(client: ModelRewriter) -> None:
    result = await rewrite(HISTORY, "Why does it exist? [[say:Why does the CPython GIL exist?]]", client, TIMEOUT_S)
    assert (result.level, result.query, result.changed) == (LEVEL_MODEL, "Why does the CPython GIL exist?", True)


async def test_slow_model_falls_back_to_rules_within_timeout_plus_50_ms(client: ModelRewriter) -> None:
    await client.rewrite(HISTORY, "warm-up [[say:ok]]")  # connection pool warm, as on a live proxy
    started = time.perf_counter()
    result = await rewrite(HISTORY, "Why does it exist? [[delay:3]]", client, TIMEOUT_S)
    elapsed = time.perf_counter() - started
    assert result.level == LEVEL_RULES and result.reason == "timeout"
    assert result.query == "Why does the Python GIL exist? [[delay:3]]"
    assert elapsed < TIMEOUT_S + 0.05, elapsed


async def test_failing_model_falls_back_to_rules(client: ModelRewriter) -> None:
    result = await rewrite(HISTORY, "Why does it exist? [[status:503]]", client, TIMEOUT_S)
    assert result.level == LEVEL_RULES and result.reason == "no_answer" and result.changed


async def test_truncated_body_falls_back_to_rules(client: ModelRewriter) -> None:
    result = await rewrite(HISTORY, "Why does it exist? [[badsse]]", client, TIMEOUT_S)
    assert result.level == LEVEL_RULES and result.reason == "no_answer"


async def test_unreachable_model_falls_back_to_rules() -> None:
    async with ModelRewriter("http://127.0.0.1:9/v1", "m", timeout_s=TIMEOUT_S) as dead:
        result = await rewrite(HISTORY, "Why does it exist?", dead, TIMEOUT_S)
    assert result.level == LEVEL_RULES and result.query == "Why does the Python GIL exist?"
