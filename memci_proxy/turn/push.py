"""The proactive recall round of a managed turn (the cache-neutral push): weighed on every user turn by what the
message needs from the archive (memci_proxy.recall.push.salience), shaped by memci_proxy.recall.push.proactive, answered
within the room the plan left, kept as hidden messages like a model-called one."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memci_proxy.engine.config import EngineConfig
from memci_proxy.engine.intent import message_text
from memci_proxy.engine.state import ConversationState
from memci_proxy.metrics import Metrics
from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.push.proactive import (LOOK_UP_TERMS, asks_about_reply, has_cjk, is_look_up, push_call,
                                               recall_round, search_words)
from memci_proxy.recall.resolver import SEARCH_HITS, RecallContext, RecallResolver, allowed_hits
from memci_proxy.recall.push.salience import NOTHING, Weighing, asks, counts, in_text, never_known, verdict, weigh
from memci_proxy.recall.tool.rounds import ToolCall
from memci_proxy.recall.tool.schema import RecallArgs
from memci_proxy.turn.recall_rounds import CALL_FRAMING_TOKENS, RESULT_FRAMING_TOKENS, TurnRecall
from memci_proxy.turn.turn import Turn

log = logging.getLogger("memci.turn")
MIN_RESULT_TOKENS = 64  # below this the resolver answers "no room": not worth a round
# A look-up for something the active pages lack plans under this ceiling (fraction of the budget) instead of the
# high watermark, so that the pushed round has room (the push stays under 0.90 of the budget): near the top of the
# budget the epoch comes on the look-up's turn, a few turns early, instead of the look-up going without its round.
PUSH_HIGH_WATERMARK = 0.85
# A question the archive answers plans under this one: room for a round of a page or two, an epoch brought forward
# less often (a question is asked more often than a look-up phrase; each early epoch costs a miss)
QUESTION_HIGH_WATERMARK = 0.88
PUSH_SHARE = 0.8  # of the room left, what the pushed round may take
# Tokens shown of each page, twice that of the best (about 320 characters of English, 80 of Chinese): what the
# push adds stays in the history until the next epoch, so its size is what it costs the prefix cache
EXCERPT_TOKENS = 80


WANTED = ("pushed", "narrow")


@dataclass(frozen=True, slots=True)
class Need:
    """What the latest user message needs from the archive, weighed on every user turn before planning."""

    text: str  # the message
    weighing: Weighing
    asking: str  # "look_up" (a look-up phrase), "question" or "" (a statement): a question needs a weaker match
    # memci_proxy.recall.push.salience.verdict ("pushed", "narrow", "no_match", "weak", "in_prompt") or "no_archive"
    reason: str

    @property
    def wanted(self) -> bool:
        return self.reason in WANTED

    @property
    def room_wanted(self) -> bool:
        """Plan the turn with room for the round (an epoch a few turns early, if need be): a look-up phrase or a
        question the archive answers (under ``room_ceiling``). A statement or a narrow match is pushed only where
        the prompt has room left."""
        return self.reason == "pushed" and self.asking != ""

    @property
    def room_ceiling(self) -> float:
        """The high watermark the turn plans under when ``room_wanted``."""
        return PUSH_HIGH_WATERMARK if self.asking == "look_up" else QUESTION_HIGH_WATERMARK


def latest_user_text(messages: Sequence[dict[str, Any]]) -> str | None:
    if not messages or messages[-1].get("role") != "user":
        return None
    return message_text(messages[-1])


def need_of(index: BM25Index, text: str, state: ConversationState, messages: Sequence[dict[str, Any]]) -> Need:
    """The message weighed against the archive (``index``); the active pages are read only when an archived page
    matches strongly (a turn that does not push costs the message's terms and a few short postings), and then as
    one case-folded text searched for the matched terms (memci_proxy.recall.push.salience.in_text); not at all for a
    count (memci_proxy.recall.push.salience.counts)."""
    kind = "look_up" if is_look_up(text) else "question" if asks(text) else ""
    weighing = weigh(index, text)
    reason = verdict(weighing, kind)
    if reason in WANTED:
        # a count ("how many times have I…") is answered by every mention, the archive's too: what the active pages
        # name does not make the round needless
        weighing = weigh(index, text, never_known if counts(text) else in_text(active_text(state, messages)))
        reason = verdict(weighing, kind)
        if reason not in WANTED:
            reason = "in_prompt"
    return Need(text, weighing, kind, reason)


def active_text(state: ConversationState, messages: Sequence[dict[str, Any]]) -> str:
    """What the prompt already shows of the conversation, case-folded: the active pages' messages (the latest user
    message left out) and the hidden rounds spliced among them (a page an earlier round brought back is in the
    prompt: pushing it again would add its tokens to the history a second time)."""
    start = min(state.active_start_entry(), len(messages) - 1)
    parts = [message_text(m) for m in messages[start:-1]]
    parts += [message_text(m) for g in state.hidden if g.after >= start for m in g.messages]
    return "\n".join(parts).casefold()


def push_queries(need: Need) -> tuple[str, str]:
    """The push's two searches: the message's words holding the rare terms that matched (how many pages), and all
    its words, its look-up phrasing weighing nothing (which pages: the subject it names, "networking event",
    "Alex", even where the active pages name it too). A Chinese or Japanese message keeps the matched words for
    both: each of its runs of characters is a clause, those holding what matched already."""
    matched = search_words(need.text, wanted=need.weighing.held | set(need.weighing.terms)) or " ".join(need.weighing.terms)
    query = matched if has_cjk(need.text) else (search_words(need.text, skip=LOOK_UP_TERMS) or matched)
    return matched, query


def with_push_room(config: EngineConfig, ceiling: float = PUSH_HIGH_WATERMARK) -> EngineConfig:
    """The turn's engine config with the high watermark lowered to ``ceiling`` to leave the pushed round its room."""
    ceiling = max(ceiling, config.low_watermark + 0.05)  # an epoch still has somewhere to go
    if config.high_watermark <= ceiling:
        return config
    return dataclasses.replace(config, high_watermark=ceiling)


class ProactivePush:
    def __init__(self, metrics: Metrics, resolver: RecallResolver) -> None:
        self.metrics = metrics
        self.resolver = resolver

    async def weigh(self, tenant: str, conversation_id: str, state: ConversationState | None,
                    messages: list[dict[str, Any]]) -> Need | None:
        """Before planning, on every user turn: what the message needs from the archive (a wanted push plans its
        turn with room for the round). None: not a user turn, or the weighing failed."""
        text = latest_user_text(messages)
        if text is None:
            return None
        if state is None or state.first_active_page == 0:
            return Need(text, NOTHING, "", "no_archive")
        try:
            index = await self.resolver.archive_index(RecallContext(tenant, conversation_id, state, messages))
            need = need_of(index, text, state, messages)
            if need.wanted:  # the query's vector computed while the turn is planned (and its epoch stored)
                self.resolver.embed_queries_soon(push_queries(need)[1:])
            return need
        except Exception:
            log.exception("weighing the message against the archive failed; no push this turn")
            self.metrics.engine_errors.labels("push").inc()
            return None

    async def exchange(self, turn: Turn, rounds: TurnRecall, tool_name: str) -> list[dict[str, Any]]:
        """The round to append after the latest user message ([] when none is due)."""
        need: Need | None = turn.need
        if turn.plan.over_budget or need is None:
            return []
        m = self.metrics
        if any(g.after == turn.redo.last_index for g in turn.state.hidden):
            # a retry of this message: the round it got is spliced back already
            m.recall_pushes.labels("in_prompt").inc()
            return []
        try:
            if turn.plan.epoch:  # pages left the prompt on this turn: weighed again against the new archive
                index = await self.resolver.archive_index(rounds.context)
                need = need_of(index, need.text, turn.state, turn.redo.input.messages)
            if not need.wanted:
                m.recall_pushes.labels(need.reason).inc()
                return []
            return await self._exchange(turn, rounds, tool_name, need)
        except Exception:
            log.exception("proactive recall failed; the turn goes on without it")
            m.recall_pushes.labels("failed").inc()
            m.engine_errors.labels("push").inc()
            return []

    async def _exchange(self, turn: Turn, rounds: TurnRecall, tool_name: str, need: Need) -> list[dict[str, Any]]:
        m = self.metrics
        matched, query = push_queries(need)
        call = push_call(tool_name, query, f"{turn.redo.last_index}")
        counter = self.resolver.counter
        within, limit = round_room(turn, rounds, call)
        if limit < MIN_RESULT_TOKENS:
            m.recall_pushes.labels("no_room").inc()
            return []
        # How many pages: those the matched words find (the best, and of the next four those holding a rare term
        # of the message: the pages of each session a "how many X did I ..." spans); none found, no round
        holding = need.weighing.holding.__contains__
        # the search weighs what the user gave a count of (memci_proxy.recall.lexical.counting)
        counting = counts(need.text)
        # one vector ranks both searches' candidates: all the message's words' (started by `weigh` already, else by
        # the search; an epoch changes the matched words, not these)
        found = allowed_hits(await self.resolver.search(rounds.context, matched, SEARCH_HITS, counting=counting,
                                                        vector_text=query), holding)
        if not found:
            m.recall_pushes.labels("no_hits").inc()
            return []
        # Below the best hit, only pages that hold a rare term of the message: a page that shares the message's
        # common words alone is not pushed. A question about what the assistant said ("how many eggs did you say?")
        # shows each page's reply before the user's words where the terms meet in both
        outcome = await self.resolver.resolve(rounds.context, RecallArgs(query=query), limit=limit,
                                              newest_first=True, excerpt_tokens=EXCERPT_TOKENS, hits_shown=len(found),
                                              shown_if=holding, muted=LOOK_UP_TERMS, keep=found[0][0],
                                              reply_first=asks_about_reply(need.text), counting=counting)
        if not outcome.hits:
            m.recall_pushes.labels("no_hits").inc()
            return []
        m.recall_search_seconds.observe(outcome.search_seconds)
        exchange = recall_round(call, outcome.text)
        m.recall_pushes.labels("pushed").inc()
        m.recall_push_tokens.observe(charge_round(rounds, exchange, within))
        # the upstream's count when it can tell: asked now, settled before the model's own round needs the room
        await rounds.count_soon(outcome.text, counter.count_text(outcome.text), round_tokens(rounds, exchange))
        return exchange


def round_room(turn: Turn, rounds: TurnRecall, call: ToolCall) -> tuple[int, int]:
    """(the room within the plan's budget, in planned tokens; the tokens the result may take, in the resolver's
    base count) of a round the proxy pushes with ``call``."""
    # Unlike a call the model makes, the push is the proxy's choice: it stays within the plan's budget (the
    # model's own calls may still use half the safety margin), 10% kept for the estimate's error.
    within = int((0.90 * turn.plan.budget - turn.plan.estimated_tokens) / max(1.0, turn.state.correction_ratio))
    # the resolver's limit is in the base count; the room in planned tokens (learned costs: `density` of each)
    # At most PUSH_SHARE of it: the rest is the estimate's slack and the model's own recall round.
    limit = (int(PUSH_SHARE * min(rounds.room, within) / rounds.density)
             - rounds.resolver.counter.count_text(call.arguments) - CALL_FRAMING_TOKENS - RESULT_FRAMING_TOKENS)
    return within, limit


def round_tokens(rounds: TurnRecall, exchange: list[dict[str, Any]]) -> int:
    """A round's tokens in the resolver's base count."""
    return sum(rounds.resolver.counter.count_message(x) for x in exchange)


def charge_round(rounds: TurnRecall, exchange: list[dict[str, Any]], within: int) -> int:
    """The pushed round's tokens (planned), taken from the room the model's own rounds have left."""
    pushed = math.ceil(round_tokens(rounds, exchange) * rounds.density)
    # What the model's own rounds may still add: after a push, within the budget too (no margin allowance), so
    # that a turn the proxy chose to extend never goes over it.
    rounds.room = max(0, min(rounds.room, within) - pushed)
    rounds.initial_room = max(0, min(rounds.initial_room, within) - pushed)
    return pushed
