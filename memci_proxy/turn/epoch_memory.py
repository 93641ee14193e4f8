"""The summary (B4) and profile (B2a) a turn's plan may take at an epoch: those covering every page the conversation
archived before it (``memci_proxy.workers.covering``), so any replica plans the epoch the same. While the jobs are behind,
the plan gets what the state already shows; an epoch planned so is planned again once they are done (at most
``summary_wait_s`` later). On a one-slot engine the epoch's jobs go upstream before its request (``jobs_first``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memci_proxy.engine.state import ConversationState
from memci_proxy.workers.covering import archived_through


@dataclass(frozen=True)
class EpochMemory:
    summary: str
    profile: str
    behind: bool = False  # the jobs have not taken in the archived pages yet: an epoch waits for them
    through: int = -1  # the last archived message they must cover


async def epoch_memory(memory: Any, tenant: str, conversation_id: str, state: ConversationState | None,
                       end_user: str) -> EpochMemory:
    """What this turn's plan may put into the prompt at an epoch (it only does at epochs)."""
    if memory is None:
        return EpochMemory("", "")
    if state is None:  # a new conversation: its end user's profile, if it has one
        return EpochMemory("", await memory.latest_profile(tenant, conversation_id, end_user) if end_user else "")
    through = archived_through(state)
    found = await memory.covering(tenant, conversation_id, through, end_user)
    if found is None:
        return EpochMemory(state.summary, state.profile, True, through)
    return EpochMemory(found.summary, found.profile, False, through)


async def waited(memory: Any, tenant: str, conversation_id: str, behind: EpochMemory, end_user: str
                 ) -> EpochMemory | None:
    """The jobs' result once they have caught up (None: they did not in time, or failed)."""
    found = await memory.wait_covering(tenant, conversation_id, behind.through, end_user)
    return None if found is None else EpochMemory(found.summary, found.profile, False, behind.through)


async def jobs_first(memory: Any, cache_kind: Any, turn: Any, timeout_s: float) -> None:
    """On a one-slot engine (``upstream_cache``: ``cache_kind``), an epoch's summary and profile jobs go upstream
    before its request: they resend the pre-epoch prompt the slot still holds, and the epoch's request shares only
    its head with either. Sent after the answer, they would take the slot from the live conversation."""
    if not turn.plan.archived or memory is None or not getattr(memory, "shares_upstream", False):
        return
    if await cache_kind.single_slot():
        turn.jobs_first = await memory.run_before(turn.call.tenant, turn.conversation_id, timeout_s)
