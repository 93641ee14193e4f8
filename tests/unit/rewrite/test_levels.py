"""Level selection: model -> rules -> pass-through, with fake model clients."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import memci_proxy.rewrite.levels as levels
from memci_proxy.rewrite import (
    LEVEL_MODEL,
    LEVEL_PASSTHROUGH,
    LEVEL_RULES,
    RewriteResult,
    build_prompt,
    clean_answer,
    rewrite,
)

HISTORY = [
    {"role": "user", "content": "Tell me about the Python GIL."},
    {"role": "assistant", "content": "It is a lock."},
]
RULES_ANSWER = "Why does the Python GIL exist?"


class FakeModel:
    def __init__(self, answer: str | None = "Why does CPython have a GIL?", delay: float = 0.0, error: bool = False):
        self.answer, self.delay, self.error = answer, delay, error
        self.calls: list[tuple[list, str]] = []
        self.cancelled = False

    async def rewrite(self, history: Sequence[Mapping[str, Any]], last_user: str) -> str | None:
        self.calls.append((list(history), last_user))
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self.error:
            raise RuntimeError("model down")
        return self.answer


async def test_model_answer_serves() -> None:
    model = FakeModel()
    result = await rewrite(HISTORY, "Why does it exist?", model, timeout_s=1.0)
    assert result == RewriteResult("Why does CPython have a GIL?", LEVEL_MODEL, True)
    assert model.calls == [(HISTORY, "Why does it exist?")]


async def test_model_answer_equal_to_the_message_is_unchanged() -> None:
    result = await rewrite(HISTORY, "Why does it exist?", FakeModel("Why does it  exist?"), timeout_s=1.0)
    assert result.level == LEVEL_MODEL and not result.changed


async def test_slow_model_falls_back_to_rules_and_is_cancelled() -> None:
    model = FakeModel(delay=30.0)
    result = await rewrite(HISTORY, "Why does it exist?", model, timeout_s=0.05)
    assert result == RewriteResult(RULES_ANSWER, LEVEL_RULES, True, "timeout")
    assert model.cancelled


@pytest.mark.parametrize(
    ("model", "reason"),
    [(FakeModel(error=True), "error"), (FakeModel(answer=None), "no_answer"), (FakeModel(answer="  "), "no_answer")],
)
async def test_failing_model_falls_back_to_rules(model: FakeModel, reason: str) -> None:
    result = await rewrite(HISTORY, "Why does it exist?", model, timeout_s=1.0)
    assert result == RewriteResult(RULES_ANSWER, LEVEL_RULES, True, reason)


async def test_no_model_or_zero_timeout_uses_rules() -> None:
    expected = RewriteResult(RULES_ANSWER, LEVEL_RULES, True, "disabled")
    assert await rewrite(HISTORY, "Why does it exist?", None) == expected
    model = FakeModel()
    result = await rewrite(HISTORY, "Why does it exist?", model, timeout_s=0)
    assert result.level == LEVEL_RULES and not model.calls


async def test_rules_failure_passes_the_message_through(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(history: Any, last_user: str) -> RewriteResult:
        raise ValueError("bad input")

    monkeypatch.setattr(levels, "rewrite_rules", broken)
    result = await rewrite(HISTORY, "Why does it exist?", FakeModel(answer=None), timeout_s=1.0)
    assert result == RewriteResult("Why does it exist?", LEVEL_PASSTHROUGH, False, "no_answer+rules_error")


def test_prompt_is_short_and_ends_with_the_message() -> None:
    history = [{"role": "system", "content": "secret system prompt"}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "x" * 2000} for i in range(10)
    ]
    messages = build_prompt(history, "Why does it exist? [[delay:1]]")
    assert [m["role"] for m in messages] == ["system", "user"]
    body = messages[1]["content"]
    assert "secret" not in body and "turn 3 " not in body and "turn 4 " in body
    assert body.endswith("Last message:\nWhy does it exist? [[delay:1]]")
    assert len(body) < 6 * 620 + 200


def test_clean_answer() -> None:
    assert clean_answer('  "Why does CPython have a GIL?"\n', "q") == "Why does CPython have a GIL?"
    assert clean_answer("Standalone intent: What is X?", "q") == "What is X?"
    assert clean_answer("Rewritten:\nWhat is\n X?", "q") == "What is X?"
    assert clean_answer("", "q") is None
    assert clean_answer("y" * 5000, "short") is None
