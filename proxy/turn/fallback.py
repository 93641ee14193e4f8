"""The fallback prompt when the store of truth cannot take a turn (DESIGN.md section 9: "Postgres down -> do not
archive, fall back to trimming that keeps the request valid").

Nothing is archived: the client still holds every message and resends it next turn, when the engine plans from
the last durable state again. The request keeps its leading system messages and the newest messages that fit the
prompt budget, cut at a user message so that no tool result loses its call.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from proxy.engine import EngineConfig
from proxy.engine.tokens import TokenCounter

log = logging.getLogger("memci.turn")
_encode = msgspec.json.Encoder().encode


def trim_to_budget(
    system: list[dict[str, Any]], messages: list[dict[str, Any]], budget: int, counter: TokenCounter,
    fixed_tokens: int = 0,
) -> list[dict[str, Any]] | None:
    """system + the longest suffix of messages starting at a user message that fits in budget.

    Returns None when the request fits unchanged (send it as it is). When not even the newest user message and
    what follows it fit, that suffix is returned anyway (the upstream then answers with its own error).
    """
    costs = [counter.count_message(m) for m in messages]
    used = fixed_tokens + sum(counter.count_message(m) for m in system)
    if used + sum(costs) <= budget:
        return None
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not starts:
        return None
    suffix_cost = [0] * (len(messages) + 1)
    for i in range(len(messages) - 1, -1, -1):
        suffix_cost[i] = suffix_cost[i + 1] + costs[i]
    for start in starts:  # the oldest start that fits keeps the most context
        if used + suffix_cost[start] <= budget:
            return [*system, *messages[start:]]
    return [*system, *messages[starts[-1]:]]


def unmanaged_body(data: dict[str, Any], body: bytes, system: list[dict[str, Any]], messages: list[dict[str, Any]],
                   config: EngineConfig, counter: TokenCounter, ratio: float) -> bytes:
    """The body to send without context management: ``body`` itself when the request fits the budget (or cannot be
    measured), else the request trimmed. ``ratio``: the upstream's tokens per estimated token, as last learned."""
    try:
        max_tokens = data.get("max_completion_tokens") or data.get("max_tokens")
        budget = config.budget(max_tokens if isinstance(max_tokens, int) else None)
        budget = int(budget / (1.03 * ratio))  # in the upstream's tokens, with a 3% margin
        tools = data.get("tools")
        fixed = counter.count_text(_encode(tools).decode()) if tools else 0
        trimmed = trim_to_budget(system, messages, budget, counter, fixed)
    except Exception:
        log.exception("could not trim the request; forwarding it unchanged")
        return body
    return body if trimmed is None else _encode({**data, "messages": trimmed})
