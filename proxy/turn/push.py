"""The proactive recall round of a managed turn (the cache-neutral push): decided and shaped by
proxy.recall.proactive, answered within the room the plan left, kept as hidden messages like a model-called one."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

from proxy.engine.config import EngineConfig
from proxy.engine.intent import message_text
from proxy.engine.state import ConversationState
from proxy.metrics import Metrics
from proxy.recall.proactive import content_words, decide, is_look_up, missing_terms, push_call, push_query, recall_round
from proxy.recall.resolver import SEARCH_HITS, RecallResolver
from proxy.recall.tool import RecallArgs
from proxy.settings import Settings
from proxy.turn.recall_rounds import CALL_FRAMING_TOKENS, RESULT_FRAMING_TOKENS, TurnRecall
from proxy.turn.turn import Turn
from proxy.turn.volatile import VolatileContext

log = logging.getLogger("memci.turn")
MIN_RESULT_TOKENS = 64  # below this the resolver answers "no room": not worth a round
# A look-up for something the active pages lack plans under this ceiling (fraction of the budget) instead of the
# high watermark, so that the pushed round has room (the push stays under 0.90 of the budget): near the top of the
# budget the epoch comes on the look-up's turn, a few turns early, instead of the look-up going without its round.
PUSH_HIGH_WATERMARK = 0.85


def look_up_text(messages: Sequence[dict[str, Any]]) -> str | None:
    """The latest message's text when it is the user's and looks something up (None otherwise): read once a turn,
    for the plan's room and for the push."""
    if not messages or messages[-1].get("role") != "user":
        return None
    text = message_text(messages[-1])
    return text if is_look_up(text) else None


def push_wanted(state: ConversationState | None, messages: Sequence[dict[str, Any]], look_up: str | None) -> bool:
    """Before planning: the look-up (``look_up_text``) asks for words that the active pages do not hold and the
    conversation has archived pages (the push then needs room; whether it fires is decided after the plan)."""
    if look_up is None or state is None or state.first_active_page == 0:
        return False
    start = min(state.active_start_entry(), len(messages) - 1)
    return bool(missing_terms(content_words(look_up), (message_text(m) for m in messages[start:-1])))


def with_push_room(config: EngineConfig) -> EngineConfig:
    """The turn's engine config with the high watermark lowered to leave the pushed round its room."""
    ceiling = max(PUSH_HIGH_WATERMARK, config.low_watermark + 0.05)  # an epoch still has somewhere to go
    if config.high_watermark <= ceiling:
        return config
    return dataclasses.replace(config, high_watermark=ceiling)


class ProactivePush:
    def __init__(self, settings: Settings, metrics: Metrics, resolver: RecallResolver, volatile: VolatileContext
                 ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.resolver = resolver
        self.volatile = volatile

    async def exchange(self, turn: Turn, rounds: TurnRecall, tool_name: str) -> list[dict[str, Any]]:
        """The round to append after the latest user message ([] when none is due). Searches only on look-ups."""
        messages, text = turn.redo.input.messages, turn.look_up
        if turn.plan.over_budget or text is None:
            return []
        if any(g.after == turn.redo.last_index for g in turn.state.hidden):
            # a retry of this message: the round it got is spliced back already
            self.metrics.recall_pushes.labels("in_prompt").inc()
            return []
        try:
            return await self._exchange(turn, rounds, tool_name, messages, text)
        except Exception:
            log.exception("proactive recall failed; the turn goes on without it")
            self.metrics.recall_pushes.labels("failed").inc()
            self.metrics.engine_errors.labels("push").inc()
            return []

    async def _exchange(self, turn: Turn, rounds: TurnRecall, tool_name: str, messages: list[dict[str, Any]],
                        text: str) -> list[dict[str, Any]]:
        m = self.metrics
        state = turn.state
        rewritten = await self.volatile.rewrite(messages, "rules")  # standalone words; no model call on this path
        query_text = rewritten.query if rewritten is not None else text
        start = state.active_start_entry()
        missing = missing_terms(content_words(query_text), (message_text(x) for x in messages[start:-1]))
        hits = []
        if missing and state.first_active_page > 0:
            # lexical: the floor is a BM25 score, and a turn that does not push never waits on an embedding
            hits = await self.resolver.search(rounds.context, push_query(missing), SEARCH_HITS, use_vectors=False)
        decision = decide(True, missing, hits, self.settings.recall_push_min_score)
        if not decision.push:
            m.recall_pushes.labels(decision.reason).inc()
            return []
        query = push_query(missing)
        call = push_call(tool_name, query, f"{turn.redo.last_index}")
        counter = self.resolver.counter
        # Unlike a call the model makes, the push is the proxy's choice: it stays within the plan's budget (the
        # model's own calls may still use half the safety margin), 10% kept for the estimate's error.
        within = int((0.90 * turn.plan.budget - turn.plan.estimated_tokens) / max(1.0, state.correction_ratio))
        # the resolver's limit is in the base count; the room in planned tokens (learned costs: `density` of each)
        limit = (int(min(rounds.room, within) / rounds.density) - counter.count_text(call.arguments)
                 - CALL_FRAMING_TOKENS - RESULT_FRAMING_TOKENS)
        if limit < MIN_RESULT_TOKENS:
            m.recall_pushes.labels("no_room").inc()
            return []
        outcome = await self.resolver.resolve(rounds.context, RecallArgs(query=query), limit=limit)
        m.recall_search_seconds.observe(outcome.search_seconds)
        exchange = recall_round(call, outcome.text)
        await rounds.exact(outcome.text, counter.count_text(outcome.text))  # the upstream's count when it can tell
        pushed = math.ceil(sum(counter.count_message(x) for x in exchange) * rounds.density)
        # What the model's own rounds may still add: after a push, within the budget too (no margin allowance), so
        # that a turn the proxy chose to extend never goes over it.
        rounds.room = max(0, min(rounds.room, within) - pushed)
        rounds.initial_room = max(0, min(rounds.initial_room, within) - pushed)
        m.recall_pushes.labels("pushed").inc()
        m.recall_push_tokens.observe(pushed)
        return exchange
