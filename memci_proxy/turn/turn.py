"""What one managed turn carries from planning to the end of its answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memci_proxy.engine import ConversationState, EngineConfig, Plan, TurnInput
from memci_proxy.turn.call import ChatCall
from memci_proxy.turn.rows import RowSet
from memci_proxy.turn.stages import StageClock
from memci_proxy.turn.states import Known


@dataclass
class Redo:
    """What it takes to plan a turn again on another stored state (after a conflict)."""

    input: TurnInput
    config: EngineConfig
    fingerprints: list[tuple[str, int]]  # (chain hash, prefix length) of the prefixes this request adds
    last_index: int
    hidden: list[dict[str, Any]] = field(default_factory=list)
    recalled: list[str] = field(default_factory=list)
    counter: Any = None  # the TokenCounter the turn was planned with (the model's learned counts, or the estimate)


@dataclass
class Turn:
    """What one request learned and decided, carried from planning to the end of the answer."""

    call: ChatCall
    conversation_id: str
    how: str  # "session_key" | "prefix" | "new" | "fork"
    known: Known  # the state the next save builds on
    plan: Plan
    state: ConversationState  # the plan's state, with what the rounds and the answer add
    rows: RowSet  # not stored yet
    redo: Redo
    record: Any = None  # memci_proxy.recall.tool.rounds.LoopRecord of the recall rounds
    usage: dict[str, Any] | None = None
    model: str = ""
    tools_json: str = ""  # the tools as sent upstream (count learning)
    learned: bool = False  # planned with the model's learned counts
    pushed_tokens: int = 0  # estimated tokens of the proactive recall round sent with the first round
    accounting: dict[str, int] = field(default_factory=dict)  # tokens shed / re-prefilled by the plan (admin view)
    need: Any = None  # memci_proxy.turn.push.Need: what the latest user message needs from the archive (push on)
    across: Any = None  # memci_proxy.turn.across.AcrossNeed: what the user's other conversations hold for it
    window: int = 0  # the context window the turn was planned for
    jobs_first: bool = False  # the epoch's memory jobs ran before its request (a one-slot engine)
    sent_estimate: int = 0  # the first round's prompt as estimated when its max_tokens was fitted (upstream tokens)
    estimate_scale: float = 1.0  # the upstream's count of a prompt per estimated token, when a refusal told it
    keeping: Any = None  # asyncio.Task: the pushed round's write, under way while its request is upstream
    stages: StageClock = field(default_factory=StageClock)  # where the turn's time went (memci_turn_stage_seconds)


class Release:
    """Releases the session lock once (the release itself is shielded from cancellation inside the lock)."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.done = False

    async def __call__(self) -> None:
        if not self.done:
            self.done = True
            await self.lock.__aexit__(None, None, None)
