"""A managed turn's end, once its answer is out (memci_proxy.turn.service runs the rest): the upstream's usage fed
back, the pages the model recalled, the turn stored (queued behind the answer with write-behind), the end user's
pages noted, the memory workers told, the search indexes prepared, and the session lock released, whatever failed."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

from memci_proxy.engine import ConversationState, observe_usage, record_recall
from memci_proxy.metrics import Metrics
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.settings import Settings
from memci_proxy.store.ports import StaleState
from memci_proxy.turn.across import UserMemory
from memci_proxy.turn.counting import TurnCounts
from memci_proxy.turn.keeping import RoundKeeping
from memci_proxy.turn.rows import page_rows
from memci_proxy.turn.states import ConversationStates
from memci_proxy.turn.turn import Release, Turn
from memci_proxy.upstream.exchange import Answer

log = logging.getLogger("memci.turn")

# Past this share of its budget a conversation's next epoch is near: the terms of its active pages are read behind
# the answers from then on (the epoch then archives them without reading them). Below it (a conversation that may
# never reach an epoch) nothing is read ahead.
PREPARE_SHARE = 0.6


def near_an_epoch(plan: Any) -> bool:
    return plan.estimated_tokens >= PREPARE_SHARE * plan.budget


class TurnEnding:
    def __init__(self, settings: Settings, metrics: Metrics, counts: TurnCounts, states: ConversationStates,
                 across: UserMemory, resolver: RecallResolver, keeping: RoundKeeping, recall_enabled: bool) -> None:
        self.settings = settings
        self.metrics = metrics
        self.counts = counts
        self.states = states
        self.across = across
        self.resolver = resolver
        self.keeping = keeping
        self.recall_enabled = recall_enabled
        self.memory: Any = None  # memci_proxy.workers.runner.MemoryWorker when the memory workers run
        self._finishing: set[asyncio.Task[None]] = set()
        self._preparing: set[asyncio.Task[None]] = set()  # search indexing after a turn (memci_proxy.recall)

    async def after_answer(self, answer: Answer, turn: Turn, release: Release) -> Answer:
        """Finish the turn once the answer is out: after the last event of a stream; for a whole body, right after
        it is handed over (or before, when write-behind is off)."""
        if answer.events is not None:
            answer.events = self._finish_after(answer.events, turn, release)
            return answer
        try:
            await self.keeping.kept_timed(turn)  # an answer drawn from a pushed round is not seen before it is stored
        except BaseException:  # the client went away meanwhile: the turn still ends (its write, the lock)
            self._finish_soon(turn, release)
            raise
        turn.stages.observe(self.metrics)
        if answer.status == 200 and (turn.record is None or turn.record.rounds == 0):
            self.counts.answered(answer.body)  # one round: its completion tokens count the answer's text
        if not self.settings.write_behind:
            await self.finish(turn, release)
        else:
            self._finish_soon(turn, release)
        return answer

    def _finish_soon(self, turn: Turn, release: Release) -> None:
        task = asyncio.get_running_loop().create_task(self.finish(turn, release))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _finish_after(self, events: AsyncIterator[bytes], turn: Turn, release: Release) -> AsyncIterator[bytes]:
        try:
            await self.keeping.kept_timed(turn)  # (as for a whole answer) before the first event is relayed
            async for event in events:
                yield event
        finally:
            turn.stages.observe(self.metrics)
            with anyio.CancelScope(shield=True):
                await self.finish(turn, release)

    async def finish(self, turn: Turn, release: Release) -> None:
        """After the answer: usage fed back, recall counts, the turn queued for the store, the lock released."""
        try:
            await self.keeping.kept(turn)
            state = self._fed_back(turn)
            self.states.index.soon(turn.conversation_id)  # pages stored before the request, unindexed
            await self._store(turn, state)
            new = turn.plan.new_entries
            self.across.note(turn.call.tenant, turn.call.end_user, turn.conversation_id, state,
                             turn.redo.input.messages, new[0][0] if new else len(turn.redo.input.messages))
            if self.memory is not None:
                self.memory.touch(turn.call.tenant, turn.conversation_id)
                if turn.plan.archived:  # (jobs_first: the summary and profile jobs ran before the request)
                    await self.memory.notify(turn.call.tenant, turn.conversation_id, summaries=not turn.jobs_first)
            read_ahead = near_an_epoch(turn.plan)
            embed = turn.plan.archived and self.resolver.embeds_archived_pages
            if self.recall_enabled and (read_ahead or embed):
                self._prepare_search(turn, state, read_ahead, embed)
        except Exception as exc:
            # The client resends these messages with its next request, whose plan stores them then.
            log.warning("could not store the turn of %s (%s); the next turn stores its messages",
                        turn.conversation_id, exc)
            self.metrics.store_write_failures.labels("finish").inc()
        finally:
            await release()

    def _fed_back(self, turn: Turn) -> ConversationState:
        """The turn's state with the pages the model recalled and what the upstream's usage taught."""
        state, record, usage = turn.state, turn.record, turn.usage
        if record is not None:
            usage = record.first_usage
            if record.streamed_text is not None:  # set only for an answer of one round
                self.counts.answered_stream(record.streamed_text, usage)
            if record.pages_recalled:
                recalled = list(dict.fromkeys(record.pages_recalled))
                state = record_recall(state, recalled)
                turn.redo.recalled = recalled
                turn.rows.pages.update(page_rows(state, recalled))
        prompt = usage.get("prompt_tokens") if usage else None
        if not isinstance(prompt, int) or prompt <= 0:
            return state
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        # the first round carried the push too: its estimate, scaled like the plan's
        estimated = turn.plan.estimated_tokens + math.ceil(turn.pushed_tokens * state.correction_ratio)
        try:
            state = observe_usage(state, prompt, cached if isinstance(cached, int) else None, estimated,
                                  time.time(), floor=1.0 if turn.learned else 0.0)
            if not turn.pushed_tokens:  # the learner reads the plan's prompt alone
                state = self.counts.learn(turn.model, turn.plan, turn.tools_json, prompt, state)
        except Exception:
            log.exception("usage feedback failed")
            self.metrics.engine_errors.labels("feedback").inc()
        return state

    def _prepare_search(self, turn: Turn, state: ConversationState, read_ahead: bool, embed: bool) -> None:
        """Off the answer path: the terms of the active pages read for the epoch that will archive them, and the
        pages this turn archived indexed and embedded."""
        ctx = RecallContext(turn.call.tenant, turn.conversation_id, state, turn.redo.input.messages,
                            turn.redo.input.image_descriptions)

        async def prepare() -> None:
            try:
                if read_ahead:
                    self.resolver.prepare_active(ctx)
                if embed:
                    await self.resolver.prepare(ctx)
            except Exception:
                log.exception("could not index the pages of %s", turn.conversation_id)

        task = asyncio.get_running_loop().create_task(prepare())
        self._preparing.add(task)
        task.add_done_callback(self._preparing.discard)

    async def _store(self, turn: Turn, state: ConversationState) -> None:
        tenant, cid = turn.call.tenant, turn.conversation_id
        if self.settings.write_behind:
            await self.states.save_behind(tenant, cid, turn.known, state, turn.rows, turn.redo)
            return
        try:
            await self.states.save_now(tenant, cid, turn.known, state, turn.rows)
        except StaleState:
            await self.states.redo_on_stored(tenant, cid, state, turn.redo)

    async def finished(self) -> None:
        """Until the turns answered a moment ago have ended (their writes queued)."""
        if self._finishing:
            await asyncio.gather(*self._finishing, return_exceptions=True)

    async def close(self) -> None:
        """The turns still ending finished; the search preparations cancelled."""
        await self.finished()
        for task in list(self._preparing):
            task.cancel()
        await asyncio.gather(*self._preparing, return_exceptions=True)
