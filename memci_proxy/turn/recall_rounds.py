"""A managed turn's recall rounds as the upstream exchange runs them: each call answered within the room the plan
left, each finished exchange kept (durably) before the next round goes upstream.

A result's room is charged in the upstream's tokens. Recall text is denser than the estimate says, so a result's
count is asked of the upstream (`/tokenize`). The turn waits for it only while the process has not yet seen enough
results counted (``ResultDensities``): from then on a result is cut to fit its room at a density a tenth above the
densest of the last results counted, charged at that density, and its count settled before the room is next needed,
while the round that carries it is upstream. The window's other half of its safety margin covers a result denser
still (memci_proxy.engine.config.EngineConfig.answer_tokens). A pushed result still uncounted when the model calls
recall is charged at that bound too (the call does not wait for it)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from memci_proxy.engine import ConversationState, Plan
from memci_proxy.metrics import Metrics
from memci_proxy.recall.tool.loop import LoopConfig
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.tool.rounds import LoopRecord, ToolCall
from memci_proxy.recall.tool.schema import parse_arguments
from memci_proxy.turn.stages import StageClock

T = TypeVar("T")

# What one call adds to the prompt besides its result: the assistant's call and its framing, in tokens.
CALL_FRAMING_TOKENS = 48
RESULT_FRAMING_TOKENS = 8
MIN_ROOM_TOKENS = 64 + CALL_FRAMING_TOKENS + RESULT_FRAMING_TOKENS  # below: no recall result fits any more
DENSITY_SLACK = 1.1  # a result sent before its count is cut to fit its room at this much over the densest seen
DENSITIES_KEPT = 32  # results whose density bounds the next one's
KNOWN_AFTER = 3  # results counted exactly before one goes upstream without waiting for its count
MODELS_KEPT = 64
MODEL_CHARS = 256


class ResultDensities:
    """The upstream's count of recall results per counted token, over the last ``DENSITIES_KEPT`` results this
    process counted exactly (pushed and the model's): the densest bounds the next result's, once ``KNOWN_AFTER``
    were seen."""

    def __init__(self) -> None:
        self._seen: deque[float] = deque(maxlen=DENSITIES_KEPT)

    def observe(self, density: float) -> None:
        self._seen.append(density)

    def bound(self) -> float | None:
        return max(self._seen) if len(self._seen) >= KNOWN_AFTER else None


class ResultsByModel:
    """``ResultDensities`` per model (each its own tokenizer), for the last ``MODELS_KEPT`` models asked (a name
    kept to its first ``MODEL_CHARS`` characters)."""

    def __init__(self) -> None:
        self._models: dict[str, ResultDensities] = {}  # oldest asked first

    def of(self, model: str) -> ResultDensities:
        model = model[:MODEL_CHARS]
        densities = self._models.pop(model, None) or ResultDensities()
        self._models[model] = densities
        while len(self._models) > MODELS_KEPT:
            del self._models[next(iter(self._models))]
        return densities


def recall_room(plan: Plan, state: ConversationState, safety_margin_tokens: float, unit: float = 1.0) -> int:
    """Tokens the recall rounds may add: what the plan left free, plus half of the window's safety margin (kept for
    estimate errors, which the learned correction ratio mostly removes; a prompt near the high watermark would
    otherwise leave recall no room at all). Estimates are scaled by that ratio, with a 5% margin. The room is in the
    resolver's base counts: `unit` is how many planned tokens one of them is (a model's learned text cost)."""
    ratio = max(1.0, state.correction_ratio) * max(1.0, unit)
    return max(0, int((0.95 * (plan.budget + 0.5 * safety_margin_tokens) - plan.estimated_tokens) / ratio))


class TurnRecall:
    """Implements memci_proxy.upstream.exchange.RecallRounds for one turn.

    Recall rounds append to the prompt: what they add must fit in ``room`` tokens (the caller computes it from
    what the plan left free). With n > 1 each choice continues on its own, so every call gets the whole room.
    """

    def __init__(self, config: LoopConfig, context: RecallContext, resolver: RecallResolver, metrics: Metrics,
                 room: int, choices: int, keep: Callable[[list[dict[str, Any]]], Awaitable[None]],
                 densities: ResultDensities | None = None, stages: StageClock | None = None) -> None:
        self.config = config
        self.record = LoopRecord()
        self.context = context
        self.resolver = resolver
        self.metrics = metrics
        self.initial_room = self.room = room
        self.choices = choices
        self._keep = keep
        self.densities = densities
        # the turn's clock (default: one of its own): the time answering the model's calls is its ``recall`` step
        self.stages = StageClock() if stages is None else stages
        self.density = 1.0  # the upstream's count of recall text per counted token, as measured this turn
        # pushed results whose upstream count was asked and not waited for: (text, its count, the round's tokens
        # charged in the base count, the density they were charged at), settled before the next round needs them
        self._unsettled: list[tuple[str, int, int, float]] = []

    def _asking(self) -> tuple[Any, Any] | None:
        """(prefetch, lookup) of a counter that can ask the upstream for its count (`/tokenize`), else None."""
        counter = self.resolver.counter
        prefetch, lookup = getattr(counter, "prefetch", None), getattr(counter, "lookup", None)
        return None if prefetch is None or lookup is None else (prefetch, lookup)

    async def exact(self, text: str, counted: int) -> int:
        """The upstream's count of a result when the counter can ask it (`/tokenize`), else the counted one; the
        next results' limits shrink by what this one was under-counted (recall text is denser than chat)."""
        asking = self._asking()
        if asking is None or not text:
            return counted
        prefetch, lookup = asking
        await prefetch([text], timeout=getattr(self.resolver.counter, "timeout", None))  # waited for, short or long
        exact = lookup(text)
        if exact is None:
            return counted
        if counted > 0:
            self.density = max(self.density, exact / counted)
            if self.densities is not None:
                self.densities.observe(exact / counted)
        return max(exact, counted)

    async def count_soon(self, text: str, counted: int, charged: int, charged_at: float | None = None) -> None:
        """The upstream's count of a result asked now and not waited for: the request that carries the round goes
        upstream meanwhile. Its density, and the round's charge (``charged`` base tokens, at ``charged_at``, by
        default the density then), are settled before a recall round of the model's needs the room (``settle``)."""
        asking = self._asking()
        if asking is None or not text:
            return
        await asking[0]([text], timeout=0)  # asked at once, never waited for here
        self._unsettled.append((text, counted, charged, self.density if charged_at is None else charged_at))

    async def settle(self, wait: bool = True) -> None:
        """The pushed results' counts (waited for, within the counter's timeout): the density they show, and the
        room their rounds take at it, as if each had been known when its round was charged. ``wait=False`` (a call
        of the model's, whose next round waits for this): a count the upstream has not answered yet is not waited
        for once the process knows the results' densities: the round is charged at the densest (a tenth over), as
        the model's own results are."""
        unsettled, self._unsettled = self._unsettled, []
        asking = self._asking()
        bound = None if wait or asking is None else self._density_bound()
        for text, counted, charged, charged_at in unsettled:
            if bound is not None and asking is not None and asking[1](text) is None:
                density = bound * DENSITY_SLACK  # (its count still lands in the counter's cache)
            else:
                await self.exact(text, counted)
                density = self.density
            extra = math.ceil(charged * density) - math.ceil(charged * charged_at)
            if extra > 0:
                self.room = max(0, self.room - extra)
                self.initial_room = max(0, self.initial_room - extra)

    def _density_bound(self) -> float | None:
        """The density a result is charged at without waiting for its count: the turn's and the recent results'
        densest; None: wait (no upstream count to ask, or too few results counted yet)."""
        known = self.densities.bound() if self.densities is not None else None
        if known is None or self._asking() is None:
            return None
        return max(self.density, known)

    async def resolve(self, call: ToolCall) -> str:
        return await self._timed(self._resolve(call))

    async def _resolve(self, call: ToolCall) -> str:
        await self.settle(wait=False)
        m = self.metrics
        count = self.resolver.counter.count_text
        args = parse_arguments(call.arguments)
        if self.choices > 1:
            limit = self.initial_room - count(call.arguments or "") - CALL_FRAMING_TOKENS
            outcome = await self.resolver.resolve(self.context, args, limit=limit)
        else:
            self.room -= count(call.arguments or "") + CALL_FRAMING_TOKENS
            bound = self._density_bound()
            if bound is None:  # the count waited for
                outcome = await self.resolver.resolve(self.context, args, limit=int(self.room / self.density))
                self.room -= await self.exact(outcome.text, count(outcome.text)) + RESULT_FRAMING_TOKENS
            else:  # charged at the bound, counted while the next round is upstream
                outcome = await self.resolver.resolve(self.context, args,
                                                      limit=int(self.room / (bound * DENSITY_SLACK)))
                counted = count(outcome.text)
                await self.count_soon(outcome.text, counted, counted, bound)
                self.room -= math.ceil(counted * bound) + RESULT_FRAMING_TOKENS
            if self.room < MIN_ROOM_TOKENS:
                self.config.answer_now = True  # another call could only add "no room": the model answers next
        m.recall_calls.labels(outcome.kind).inc()
        self.record.kinds.append(outcome.kind)
        self.record.pages_recalled.extend(outcome.pages)
        if outcome.pages:
            m.recall_pages.inc(len(outcome.pages))
        if args.query:
            m.recall_search_seconds.observe(outcome.search_seconds)
        return outcome.text

    async def keep(self, exchange: list[dict[str, Any]]) -> None:
        await self._timed(self._keep(exchange))

    async def _timed(self, step: Awaitable[T]) -> T:
        """``step`` awaited, its time the turn's ``recall`` step."""
        began = time.perf_counter()
        try:
            return await step
        finally:
            self.stages.add("recall", began)
