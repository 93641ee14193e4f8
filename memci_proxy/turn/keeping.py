"""A turn's recall exchanges kept: each finished exchange (the proxy's pushed round, the model's own recall rounds)
becomes hidden messages of the conversation's state, stored before the answer is seen, since the client never
resends them (memci_proxy.turn.service runs the turn; memci_proxy.turn.ending waits for these writes)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from memci_proxy.engine import add_hidden
from memci_proxy.metrics import Metrics
from memci_proxy.turn.rows import RowSet, hidden_rows, page_rows
from memci_proxy.turn.states import ConversationStates
from memci_proxy.turn.turn import Turn

log = logging.getLogger("memci.turn")


class RoundKeeping:
    def __init__(self, states: ConversationStates, counter: Any, metrics: Metrics) -> None:
        self.states = states
        self.counter = counter  # the base count, for a turn planned without a counter of its own
        self.metrics = metrics

    async def keep(self, turn: Turn, exchange: list[dict[str, Any]], alongside: bool = False) -> None:
        """A finished recall exchange becomes hidden messages of the state, stored before the next round: the client
        never resends them. `alongside` (the pushed round; a whole answer's rounds): stored while the request carrying
        it is upstream instead: that request holds it, and the turn's next write, its answer and its end wait for the
        write (`kept`), so the conversation's next request does too (the lock is released after it)."""
        await self.kept(turn)
        after = turn.redo.last_index
        if after < 0:
            return
        try:
            turn.state = add_hidden(turn.state, after, exchange, turn.redo.counter or self.counter)
        except Exception:
            log.exception("could not record the recall exchange")
            self.metrics.engine_errors.labels("recall").inc()
            return
        turn.rows.hidden.update(hidden_rows(after, len(turn.redo.hidden), exchange))
        turn.redo.hidden.extend(exchange)
        turn.rows.pages.update(page_rows(turn.state, [p.label for p in turn.state.pages if p.start <= after < p.end]))
        if alongside:
            turn.keeping = asyncio.get_running_loop().create_task(self._store(turn))
        else:
            await self._store(turn)

    async def _store(self, turn: Turn) -> None:
        try:
            turn.known = await self.states.save_now(turn.call.tenant, turn.conversation_id, turn.known, turn.state,
                                                    turn.rows)
            turn.rows = RowSet()
        except Exception as exc:  # stored behind the answer instead (with the rest of the turn)
            log.warning("could not store the recall exchange of %s now (%s)", turn.conversation_id, exc)
            self.metrics.store_write_failures.labels("recall").inc()

    @staticmethod
    async def kept(turn: Turn) -> None:
        """The pushed round's write, when under way, landed (or failed: its rows are then stored with the turn). A
        cancelled wait leaves it to the next one (the end of the turn waits for it still)."""
        task = turn.keeping
        if task is not None:
            await asyncio.wait([task])  # (its own failure is handled inside; a cancellation of ours still raises)
            if turn.keeping is task:
                turn.keeping = None

    async def kept_timed(self, turn: Turn) -> None:
        """``kept``, its wait counted as the turn's ``kept`` stage when a write was under way."""
        if turn.keeping is None:
            return
        waiting = time.perf_counter()
        await self.kept(turn)
        turn.stages.add("kept", waiting)
