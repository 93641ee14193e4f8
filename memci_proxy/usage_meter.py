"""The upstream's reported usage of the request being served, for whoever needs it per request (virtual keys'
token budgets). ``memci_proxy.metrics.Metrics.observe_usage`` feeds it: every usage the proxy accounts for a request
(one per plain request or stream, the sum over recall rounds) passes there."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class UsageMeter:
    tokens: int = 0


CURRENT: ContextVar[UsageMeter | None] = ContextVar("memci_usage_meter", default=None)


def record(usage: dict) -> None:
    meter = CURRENT.get()
    if meter is None:
        return
    total = usage.get("total_tokens")
    if not isinstance(total, int):
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        total = (prompt if isinstance(prompt, int) else 0) + (completion if isinstance(completion, int) else 0)
    if total > 0:
        meter.tokens += total
