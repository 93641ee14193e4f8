"""The fallback prompt when the store of truth cannot take a turn (DESIGN.md section 9: "Postgres down -> do not
archive, fall back to trimming that keeps the request valid").

Nothing is archived: the client still holds every message and resends it next turn, when the engine plans from
the last durable state again. The request keeps its leading system messages and the newest messages that fit the
prompt budget, cut at a user message so that no tool result loses its call, and its max_tokens lowered so that
prompt and answer fit the window; a request whose newest turn alone leaves no room for a small answer is refused
(400).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import msgspec

from memci_proxy.engine import EngineConfig
from memci_proxy.engine.tokens import TokenCounter
from memci_proxy.turn.answer_room import requested_tokens, with_answer_tokens
from memci_proxy.wire.errors import ProxyError

log = logging.getLogger("memci.turn")
_encode = msgspec.json.Encoder().encode


def trim_to_budget(
    system: list[dict[str, Any]], messages: list[dict[str, Any]], budget: int, counter: TokenCounter,
    fixed_tokens: int = 0,
) -> tuple[list[dict[str, Any]] | None, int]:
    """system + the longest suffix of messages starting at a user message that fits in budget, and its estimate.

    The messages are None when the request fits unchanged (send it as it is). When not even the newest user message
    and what follows it fit, that suffix is returned with its estimate over the budget (the caller refuses it).
    """
    costs = [counter.count_message(m) for m in messages]
    used = fixed_tokens + sum(counter.count_message(m) for m in system)
    if used + sum(costs) <= budget:
        return None, used + sum(costs)
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not starts:
        return None, used + sum(costs)
    suffix_cost = [0] * (len(messages) + 1)
    for i in range(len(messages) - 1, -1, -1):
        suffix_cost[i] = suffix_cost[i + 1] + costs[i]
    for start in starts:  # the oldest start that fits keeps the most context
        if used + suffix_cost[start] <= budget:
            return [*system, *messages[start:]], used + suffix_cost[start]
    return [*system, *messages[starts[-1]:]], used + suffix_cost[starts[-1]]


def unmanaged_body(data: dict[str, Any], body: bytes, system: list[dict[str, Any]], messages: list[dict[str, Any]],
                   config: EngineConfig, counter: TokenCounter, ratio: float) -> bytes:
    """The body to send without context management: ``body`` itself when the request fits the budget (or cannot be
    measured), else the request trimmed; its max_tokens lowered so that prompt and answer fit the window.
    ``ratio``: the upstream's tokens per estimated token, as last learned. Raises the 400 of a request whose newest
    turn alone does not fit."""
    max_tokens = requested_tokens(data)
    try:
        scale = 1.03 * ratio  # in the upstream's tokens, with a 3% margin
        budget = int(config.budget(max_tokens) / scale)
        tools = data.get("tools")
        fixed = counter.count_text(_encode(tools).decode()) if tools else 0
        trimmed, estimate = trim_to_budget(system, messages, budget, counter, fixed)
    except Exception:
        log.exception("could not trim the request; forwarding it unchanged")
        return body
    if estimate > budget and not config.fits(math.ceil(estimate * scale), max_tokens):
        raise ProxyError(
            400, f"This request does not fit the model's context window of {config.context_window} tokens: its "
            f"newest turn with the system prompt and tools needs about {math.ceil(estimate * scale)} tokens, over the "
            f"prompt budget of {config.budget(max_tokens)} tokens. Shorten the newest message, the system prompt or the "
            "tools, or ask for a smaller max_tokens.", "invalid_request_error", "context_length_exceeded",
            param="messages")
    answer = config.answer_tokens(max_tokens, math.ceil(estimate * scale))
    if trimmed is None and answer == max_tokens:
        return body
    fitted = with_answer_tokens(data, answer)
    return _encode({**fitted, "messages": trimmed if trimmed is not None else [*system, *messages]})
