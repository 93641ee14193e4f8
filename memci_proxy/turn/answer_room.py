"""The answer's room in the window: the max_tokens the upstream gets, and the refusal of a turn that cannot fit.

vLLM and SGLang refuse a request whose prompt plus ``max_tokens`` passes the model's window (Claude Code asks 32,000
answer tokens; on a 32k window nothing would be left for the prompt). The engine plans the prompt with a bounded
reservation (``EngineConfig.reserve``); the request's ``max_tokens`` / ``max_completion_tokens`` is then lowered to
what the window leaves after the prompt (``EngineConfig.answer_tokens``). A turn whose fixed part and newest turn
alone pass the budget goes with a smaller answer while one fits (``EngineConfig.fits``), else it is refused with a
400 that names the sizes (never sent upstream unmanaged).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from memci_proxy.engine import EngineConfig, Plan
from memci_proxy.engine.config import MIN_ANSWER_TOKENS
from memci_proxy.metrics import Metrics
from memci_proxy.turn.recall_rounds import TurnRecall
from memci_proxy.turn.turn import Turn
from memci_proxy.upstream.refusal import Refusal
from memci_proxy.wire.errors import ProxyError

ANSWER_KEYS = ("max_completion_tokens", "max_tokens")
LOWERED_HEADER = "X-Memci-Max-Tokens-Lowered"


def requested_tokens(data: dict[str, Any]) -> int | None:
    """The answer size the request asks (max_completion_tokens first, as OpenAI reads it), None without one."""
    for key in ANSWER_KEYS:
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def with_answer_tokens(data: dict[str, Any], tokens: int | None) -> dict[str, Any]:
    """``data`` with every answer-size field it has set to ``tokens`` (itself when there is nothing to change)."""
    if tokens is None or all(data.get(key) in (None, tokens) for key in ANSWER_KEYS):
        return data
    return {**data, **{key: tokens for key in ANSWER_KEYS if data.get(key) is not None}}


def too_long(plan: Plan, config: EngineConfig, max_tokens: int | None, fixed_tokens: int) -> ProxyError:
    """The 400 of a turn whose prompt, after an epoch archived all it could, leaves no room for a small answer.
    ``fixed_tokens``: the system prompt and tools (upstream tokens, estimated)."""
    window, reserve, margin = config.context_window, config.reserve(max_tokens), config.margin()
    least = min(reserve, MIN_ANSWER_TOKENS)
    newest = max(0, plan.estimated_tokens - fixed_tokens)
    return ProxyError(
        400,
        f"This request does not fit the model's context window of {window} tokens: the part that must stay in the "
        f"prompt needs about {plan.estimated_tokens} tokens ({fixed_tokens} of system prompt, contents page and tools, {newest} of "
        f"the newest turn), over the prompt budget of {plan.budget} tokens (the window minus {reserve} reserved for "
        f"the answer and a safety margin of {margin}), and too close to the window for even a {least}-token answer "
        f"beside half that margin. "
        "Shorten the newest message, the system prompt or the tools, or ask for a smaller max_tokens.",
        "invalid_request_error", "context_length_exceeded", param="messages",
    )


def fixed_part(plan: Plan, tools_tokens: int) -> int:
    """The system message and tools of a plan, in upstream tokens (estimated)."""
    return math.ceil((plan.state.system_tokens + max(0, tools_tokens)) * max(0.0, plan.state.correction_ratio or 1.0))


def fit_answer(turn: Turn, headers: dict[str, str], body: dict[str, Any], extra_tokens: int, metrics: Metrics
               ) -> dict[str, Any]:
    """The body with its max_tokens lowered so that the planned prompt (plus ``extra_tokens``, a pushed round) and
    the answer fit the window; the answer's ``headers`` and the metric say so."""
    requested = requested_tokens(turn.call.data)
    turn.sent_estimate = math.ceil((turn.plan.estimated_tokens + extra_tokens) * turn.estimate_scale)
    tokens = turn.redo.config.answer_tokens(requested, turn.sent_estimate)
    if requested is not None and tokens is not None and tokens < requested:
        headers[LOWERED_HEADER] = str(tokens)
        metrics.max_tokens_lowered.inc()
    return with_answer_tokens(body, tokens)


def answer_limit(turn: Turn, rounds: TurnRecall, text_unit: float) -> Callable[[], int | None] | None:
    """The max_tokens of a later recall round: what the window leaves after the prompt the rounds have grown
    (``text_unit``: planned tokens per base-count token, the rounds' room being in base counts)."""
    requested = requested_tokens(turn.call.data)
    if requested is None:
        return None
    config, first = turn.redo.config, turn.sent_estimate
    unit = max(1.0, turn.state.correction_ratio) * max(1.0, text_unit) * turn.estimate_scale

    def limit() -> int | None:
        return config.answer_tokens(requested, first + math.ceil(max(0, rounds.initial_room - rounds.room) * unit))

    return limit


def estimate_scale(turn: Turn, refusal: Refusal) -> float | None:
    """The upstream's count of the refused prompt per estimated token, when its refusal states that count and the
    turn would fit with max_tokens fitted to it (None: no resend helps)."""
    prompt, requested = refusal.prompt_tokens, requested_tokens(turn.call.data)
    if not prompt or requested is None or turn.sent_estimate <= 0 or prompt <= turn.sent_estimate:
        return None
    if turn.redo.config.answer_tokens(requested, prompt) <= 1:
        return None  # the prompt alone leaves no answer: the upstream's refusal stands
    return turn.estimate_scale * prompt / turn.sent_estimate
