"""Where a managed turn's time goes: each step it took observed once in memci_turn_stage_seconds{stage}, and none it
did not take (a plain turn has no store, push or kept stage)."""

from __future__ import annotations

import asyncio
import json

import pytest

from memci_proxy.turn.stages import STAGES, StageClock
from turn_fakes import Chat, ChatUpstream, MemoryRepository, call_of, make_service


def _counts(service) -> dict[str, float]:
    get = service.metrics.registry.get_sample_value
    return {stage: get("memci_turn_stage_seconds_count", {"stage": stage}) or 0.0 for stage in STAGES}


def _sums(service) -> dict[str, float]:
    get = service.metrics.registry.get_sample_value
    return {stage: get("memci_turn_stage_seconds_sum", {"stage": stage}) or 0.0 for stage in STAGES}


def _grew(before: dict[str, float], after: dict[str, float]) -> set[str]:
    return {stage for stage in STAGES if after[stage] > before[stage]}


def test_a_stage_taken_twice_adds_up_and_is_observed_once() -> None:
    clock = StageClock()
    clock.add("plan", 1.0, 1.5)
    clock.add("plan", 2.0, 2.25)
    assert clock.seconds == {"plan": 0.75}

    class Metrics:
        def __init__(self) -> None:
            self.seen: list[tuple[str, float]] = []
            self.turn_stage = object()

        def child(self, metric, stage):
            return type("Child", (), {"observe": lambda _, seconds: self.seen.append((stage, seconds))})()

    metrics = Metrics()
    clock.observe(metrics)
    clock.observe(metrics)
    assert metrics.seen == [("plan", 0.75)]


@pytest.mark.parametrize("stream", [False, True])
async def test_each_turn_observes_the_steps_it_took(stream: bool) -> None:
    repo = MemoryRepository()
    upstream = ChatUpstream()
    service = make_service(upstream, repo, write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    counts = _counts(service)
    await chat.send(chat.user_text(0), stream=stream)  # a first turn: stored before it goes upstream
    after = _counts(service)
    assert _grew(counts, after) == {"edge", "lookup", "lock", "weigh", "plan", "store", "upstream"}
    assert all(after[s] - counts[s] == 1 for s in _grew(counts, after))  # each once
    counts = after
    await chat.send(chat.user_text(1), stream=stream)  # a plain turn: nothing stored before, nothing pushed
    assert _grew(counts, _counts(service)) == {"edge", "lookup", "lock", "weigh", "plan", "upstream"}
    i = 2
    while int(chat.last_headers.get("X-Memci-Pages-Archived", 0)) == 0:  # up to the first epoch
        counts = _counts(service)
        await chat.send(chat.user_text(i), stream=stream)
        i += 1
        assert i < 80, "no epoch"
    assert "store" in _grew(counts, _counts(service))  # the epoch's archived pages, stored before the upstream call
    await chat.send(chat.user_text(i), stream=stream)
    counts, sums = _counts(service), _sums(service)
    repo.delay = 0.05  # the pushed round's write outlasts the upstream: the answer waits for it
    answer = await service.handle(call_of([*chat.messages, {"role": "user", "content": "Remind me what I said about "
                                                                                           "code0000?"}], stream))
    if stream:
        [event async for event in answer.events]
    else:
        json.loads(answer.body)
    grew = _grew(counts, _counts(service))
    assert {"push", "kept", "upstream"} <= grew
    assert _sums(service)["kept"] - sums["kept"] > 0.02  # most of the write's 50 ms, after the upstream answered
    await service.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_answering_the_models_recall_calls_is_a_step_of_its_own(stream: bool) -> None:
    """The proxy's time between the rounds (the resolver's search here) is ``recall``, not ``upstream``."""
    service = make_service(ChatUpstream(), MemoryRepository(), write_behind_max_lag_ms=60_000)
    chat = Chat(service)
    for i in range(3):
        await chat.send(chat.user_text(i), stream=stream)
    resolve = service.resolver.resolve

    async def slow_resolve(*args, **kwargs):
        await asyncio.sleep(0.05)
        return await resolve(*args, **kwargs)

    service.resolver.resolve = slow_resolve
    counts, sums = _counts(service), _sums(service)
    asking = {"role": "user", "content": 'Look it up. [[recall:{"query": "code0000"}]]'}
    answer = await service.handle(call_of([*chat.messages, asking], stream))
    if stream:
        [event async for event in answer.events]
    else:
        json.loads(answer.body)
    after = _sums(service)
    assert _counts(service)["recall"] - counts["recall"] == 1
    assert after["recall"] - sums["recall"] >= 0.05
    assert after["upstream"] - sums["upstream"] < 0.04  # the fake upstream answers at once: the wait is not its
    await service.close()
