"""Level selection of the intent rewrite (seed 004's multi-level fallback): model -> rules -> pass-through.

``await rewrite(history, last_user, model_client, timeout_s)``:

1. model: when ``model_client`` is given, its ``rewrite(history, last_user)`` is awaited for at most
   ``timeout_s`` seconds (cancelled past it); a non-empty answer serves (``level="model"``);
2. rules: ``memci_proxy.engine.intent.rewrite_rules`` (``level="rules"``, also when it changed nothing);
3. pass-through: the client's message unchanged (``level="passthrough"``) if the rules raised.

``RewriteResult.reason`` records why the model level did not serve: ``"disabled"`` (no client),
``"timeout"`` (no answer within ``timeout_s``, whether cut here or by the client's own timeout),
``"error"`` (the client raised), ``"no_answer"`` (the client returned None early: an HTTP error, a
connection failure or an unusable answer); with ``"rules_error"`` appended (``"timeout+rules_error"``) when the
rules failed too. The caller counts ``level`` and ``reason`` in its metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from memci_proxy.engine.intent import LEVEL_MODEL, LEVEL_PASSTHROUGH, LEVEL_RULES, RewriteResult, rewrite_rules

__all__ = ["DEFAULT_TIMEOUT_S", "RewriteModel", "rewrite"]

DEFAULT_TIMEOUT_S = 0.3


class RewriteModel(Protocol):
    async def rewrite(self, history: Sequence[Mapping[str, Any]], last_user: str) -> str | None: ...


async def _ask_model(
    model_client: RewriteModel, history: Sequence[Mapping[str, Any]], last_user: str, timeout_s: float
) -> tuple[str | None, str]:
    started = time.monotonic()
    try:
        answer = await asyncio.wait_for(model_client.rewrite(history, last_user), timeout=timeout_s)
    except asyncio.TimeoutError:
        return None, "timeout"
    except asyncio.CancelledError:
        raise
    except Exception:  # a broken client must not break the request
        return None, "error"
    if answer is None or not answer.strip():
        # a client that applies the same timeout itself returns None when it expires
        return None, "timeout" if time.monotonic() - started >= 0.95 * timeout_s else "no_answer"
    return answer.strip(), ""


async def rewrite(
    history: Sequence[Mapping[str, Any]],
    last_user: str,
    model_client: RewriteModel | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RewriteResult:
    """The standalone query of ``last_user`` and the level that served it (see the module docstring)."""
    reason = "disabled"
    if model_client is not None and timeout_s > 0:
        answer, reason = await _ask_model(model_client, history, last_user, timeout_s)
        if answer is not None:
            return RewriteResult(answer, LEVEL_MODEL, " ".join(answer.split()) != " ".join(last_user.split()))
    try:
        result = rewrite_rules(history, last_user)
    except Exception:
        return RewriteResult(last_user, LEVEL_PASSTHROUGH, False, f"{reason}+rules_error")
    return RewriteResult(result.query, LEVEL_RULES, result.changed, reason)
