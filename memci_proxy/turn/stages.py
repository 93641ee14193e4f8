"""Where a managed turn's time goes: the wall time of its steps, observed once per turn in
``memci_turn_stage_seconds{stage}`` (docs/metrics.md), so that a slow turn's time can be told apart by step on any
deployment, and the benchmarks can read it per turn (loadtests/turn_kinds.py).

The steps, in the order a turn takes them (a step the turn did not take is not observed):

- ``edge``: from the request's arrival to the turn service (its body read, parsed and checked, by the API's codec);
- ``lookup``: which conversation (fingerprints, the hot copy);
- ``lock``: waiting for the conversation's session lock;
- ``weigh``: what the latest message needs from the archive and from the user's other conversations (the push's
  weighing, before planning);
- ``plan``: the rest of planning (state, counts, the engine's plan, the rows to write);
- ``store``: the write before the upstream call (an epoch's archived pages, an offloaded output, a first turn);
- ``push``: the proxy's own recall round (its searches and its text) and the start of its write;
- ``upstream``: the upstream exchange, its rounds for the model's recall calls included (a stream: until its first
  response), less the proxy's own time answering those calls;
- ``recall``: the proxy answering the model's recall calls between rounds (their reads and searches, their counts,
  the exchange kept);
- ``kept``: the answer waiting for the pushed round's write, when the upstream answered first.
"""

from __future__ import annotations

import time
from typing import Any

STAGES = ("edge", "lookup", "lock", "weigh", "plan", "store", "push", "upstream", "recall", "kept")


class StageClock:
    """The seconds of each step of one turn (a step taken twice, as a turn planned again, adds up)."""

    __slots__ = ("seconds", "observed")

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.observed = False

    def add(self, stage: str, since: float, until: float | None = None, besides: float = 0.0) -> float:
        """The step that began at ``since`` (``time.perf_counter()``) ended at ``until`` (default: now), less
        ``besides`` seconds spent meanwhile in steps of their own; returns that end."""
        end = time.perf_counter() if until is None else until
        self.seconds[stage] = self.seconds.get(stage, 0.0) + max(0.0, end - since - besides)
        return end

    def of(self, stage: str) -> float:
        """The seconds of ``stage`` so far."""
        return self.seconds.get(stage, 0.0)

    def observe(self, metrics: Any) -> None:
        """Into ``memci_turn_stage_seconds``, once."""
        if self.observed:
            return
        self.observed = True
        for stage, seconds in self.seconds.items():
            metrics.child(metrics.turn_stage, stage).observe(seconds)
