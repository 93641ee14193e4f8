"""A turn's recall rounds (memci_proxy.turn.recall_rounds.TurnRecall): a pushed result's upstream count is asked
without holding the request that carries the round, and settled (the density it shows, the round charged at it)
before a recall round of the model's needs the room. A result of the model's own call waits for its count until the
process has seen a few results counted; from then on it is cut and charged at the densest of them (a tenth over),
and settled as a pushed one."""

from __future__ import annotations

import asyncio
from collections import deque
import math
import time
from dataclasses import dataclass, field
from typing import Any

from test_tokenize_client import Tokenizer
from turn_fakes import MockUpstream

from memci_proxy.metrics import Metrics
from memci_proxy.recall.tool.loop import LoopConfig
from memci_proxy.recall.resolver import RecallOutcome
from memci_proxy.recall.tool.rounds import ToolCall
from memci_proxy.turn.push import charge_round, round_tokens
from memci_proxy.turn.recall_rounds import DENSITY_SLACK, KNOWN_AFTER, ResultDensities, TurnRecall
from memci_proxy.upstream.tokenize import UpstreamTokenCounter

# recall text is denser than the estimate: one upstream token per word, the estimate about one per four characters
PUSHED = " ".join(f"w{i % 10}" for i in range(400))
ROUND = [{"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
    "name": "recall", "arguments": "{\"query\": \"w1\"}"}}]},
         {"role": "tool", "tool_call_id": "c1", "content": PUSHED}]


@dataclass
class Resolver:
    counter: Any
    limits: list[int] = field(default_factory=list)
    text: str = "nothing found"

    async def resolve(self, context: Any, args: Any, limit: int, **_: Any) -> RecallOutcome:
        self.limits.append(limit)
        return RecallOutcome(self.text, "query")


async def _nothing(_exchange: list[dict[str, Any]]) -> None:
    return None


def _rounds(counter: Any, room: int = 5000, densities: ResultDensities | None = None, text: str = "nothing found"
            ) -> tuple[TurnRecall, Resolver]:
    resolver = Resolver(counter, text=text)
    return TurnRecall(LoopConfig("recall", 3, False), None, resolver, Metrics(), room, 1, _nothing,
                      densities), resolver


async def test_a_pushed_results_count_is_asked_and_not_waited_for():
    server = Tokenizer(delay=0.2)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    rounds, _ = _rounds(counter)
    started = time.perf_counter()
    await rounds.count_soon(PUSHED, counter.count_text(PUSHED), round_tokens(rounds, ROUND))
    assert time.perf_counter() - started < 0.1  # the request carrying the round is not held for the count
    await asyncio.sleep(0)
    assert server.bodies and server.bodies[0]["prompt"] == PUSHED  # asked at once, not gathered
    await rounds.settle()
    assert counter.lookup(PUSHED) == 400


async def test_settled_room_is_the_round_charged_at_the_density_its_count_shows():
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer(delay=0.05)), timeout=1.0)
    rounds, _ = _rounds(counter)
    estimated = round_tokens(rounds, ROUND)
    assert charge_round(rounds, ROUND, within=4000) == estimated  # at the density known then (none yet: 1.0)
    await rounds.count_soon(PUSHED, counter.count_text(PUSHED), estimated)
    assert (rounds.density, rounds.room) == (1.0, 4000 - estimated)  # not known yet
    counted = counter.count_text(PUSHED)
    await rounds.settle()
    assert rounds.density == 400 / counted > 1.2  # the case that matters: the estimate under-counted the result
    charged = math.ceil(estimated * rounds.density)  # as if the count had been waited for before the charge
    assert (rounds.room, rounds.initial_room) == (4000 - charged, 4000 - charged)


async def test_a_round_that_no_longer_fits_leaves_no_room():
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer(delay=0.02)), timeout=1.0)
    rounds, _ = _rounds(counter, room=700)
    estimated = round_tokens(rounds, ROUND)
    charge_round(rounds, ROUND, within=estimated + 10)
    await rounds.count_soon(PUSHED, counter.count_text(PUSHED), estimated)
    assert rounds.room == 10
    await rounds.settle()
    assert rounds.room == rounds.initial_room == 0


async def test_the_models_own_round_is_limited_by_the_settled_room():
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer(delay=0.05)), timeout=1.0)
    rounds, resolver = _rounds(counter)
    charge_round(rounds, ROUND, within=4000)
    await rounds.count_soon(PUSHED, counter.count_text(PUSHED), round_tokens(rounds, ROUND))
    unsettled_room = rounds.room
    await rounds.resolve(ToolCall("c2", "recall", "{\"query\": \"w2\"}"))
    assert rounds.density > 1.2  # settled before the resolver was asked
    assert resolver.limits and resolver.limits[0] < unsettled_room / rounds.density


async def test_without_an_upstream_count_nothing_is_pending():
    class Estimate:
        def count_text(self, text: str) -> int:
            return len(text) // 4

        def count_message(self, message: dict[str, Any]) -> int:
            return len(str(message.get("content") or "")) // 4

    rounds, _ = _rounds(Estimate())
    await rounds.count_soon(PUSHED, 100, 120)
    room = rounds.room
    await rounds.settle()
    assert (rounds.density, rounds.room) == (1.0, room)


def _seen(*values: float) -> ResultDensities:
    """Densities the process has seen counted (enough of them to bound the next result's)."""
    densities = ResultDensities()
    for density in values:
        densities.observe(density)
    return densities


def _result(i: int) -> str:
    return " ".join(f"{chr(97 + i)}{j % 10}" for j in range(300))  # the model's call's: 300 upstream tokens


async def test_the_models_result_waits_for_its_count_until_the_process_knows_the_density():
    server = Tokenizer(delay=0.15)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    densities = ResultDensities()
    for i in range(KNOWN_AFTER):
        rounds, _ = _rounds(counter, densities=densities, text=_result(i))
        started = time.perf_counter()
        await rounds.resolve(ToolCall("c1", "recall", "{\"query\": \"w2\"}"))
        assert time.perf_counter() - started >= 0.15  # waited for: too few results counted yet
    bound = densities.bound()
    assert bound is not None and bound > 1.2  # each result denser than its estimate


async def test_once_the_density_is_known_the_models_result_goes_without_waiting_and_is_settled_later():
    server = Tokenizer(delay=0.15)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    densities = _seen(1.1, 1.2, 1.15)
    text = _result(7)
    rounds, resolver = _rounds(counter, densities=densities, text=text)
    room = rounds.room
    count = counter.count_text
    arguments = "{\"query\": \"w2\"}"
    started = time.perf_counter()
    await rounds.resolve(ToolCall("c1", "recall", arguments))
    assert time.perf_counter() - started < 0.1  # the next round is not held for the count
    after_call = room - count(arguments) - 48
    assert resolver.limits == [int(after_call / (1.2 * DENSITY_SLACK))]  # cut with a tenth of slack
    counted = count(text)
    assert rounds.room == after_call - math.ceil(counted * 1.2) - 8  # charged at the densest seen
    await asyncio.sleep(0)
    assert any(body["prompt"] == text or text in body["prompt"] for body in server.bodies)  # asked at once
    await rounds.settle()  # the next call (or nothing) settles it: 300 upstream tokens, denser than 1.2
    assert rounds.density == 300 / counted > 1.2
    assert rounds.room == after_call - math.ceil(counted * rounds.density) - 8
    assert densities.bound() == rounds.density  # and the next results are charged at it


async def test_once_the_density_is_known_the_models_call_does_not_wait_for_a_pushed_results_count():
    server = Tokenizer(delay=0.15)
    counter = UpstreamTokenCounter(MockUpstream(server), timeout=1.0)
    densities = _seen(1.1, 1.3, 1.2)
    rounds, resolver = _rounds(counter, densities=densities, text=_result(3))
    estimated = round_tokens(rounds, ROUND)
    charge_round(rounds, ROUND, within=4000)
    await rounds.count_soon(PUSHED, counter.count_text(PUSHED), estimated)
    started = time.perf_counter()
    await rounds.resolve(ToolCall("c2", "recall", "{\"query\": \"w2\"}"))
    assert time.perf_counter() - started < 0.1  # the pushed round's count (0.15 s away) was not waited for
    at_bound = math.ceil(estimated * 1.3 * DENSITY_SLACK)  # charged at the densest seen, a tenth over
    assert rounds.initial_room == 4000 - at_bound
    assert resolver.limits and resolver.limits[0] <= (4000 - at_bound) / (1.3 * DENSITY_SLACK)
    await asyncio.sleep(0.2)
    assert counter.lookup(PUSHED) == 400  # its count still came, for the next turns


async def test_a_pushed_results_count_already_answered_is_settled_exactly_without_waiting():
    counter = UpstreamTokenCounter(MockUpstream(Tokenizer(delay=0.0)), timeout=1.0)
    densities = _seen(1.1, 1.1, 1.1)
    rounds, _ = _rounds(counter, densities=densities)
    estimated = round_tokens(rounds, ROUND)
    charge_round(rounds, ROUND, within=4000)
    counted = counter.count_text(PUSHED)
    await rounds.count_soon(PUSHED, counted, estimated)
    await asyncio.sleep(0.05)  # answered while the round was upstream
    await rounds.resolve(ToolCall("c2", "recall", "{\"query\": \"w2\"}"))
    assert rounds.density == 400 / counted > 1.2  # its own density, not the bound's
    assert rounds.initial_room == 4000 - math.ceil(estimated * rounds.density)


async def test_without_densities_the_models_result_waits_as_before():
    server = Tokenizer(delay=0.15)
    rounds, _ = _rounds(UpstreamTokenCounter(MockUpstream(server), timeout=1.0), text=_result(1))
    started = time.perf_counter()
    await rounds.resolve(ToolCall("c1", "recall", "{\"query\": \"w2\"}"))
    assert time.perf_counter() - started >= 0.15


def test_densities_bound_the_last_results_only():
    densities = ResultDensities()
    assert densities.bound() is None
    densities.observe(3.0)
    for _ in range(40):
        densities.observe(1.2)
    assert densities.bound() == 1.2  # a dense result long ago no longer weighs


def test_each_model_has_its_own_densities():
    from memci_proxy.turn.recall_rounds import MODELS_KEPT, ResultsByModel

    by_model = ResultsByModel()
    by_model.of("a").observe(2.0)
    assert by_model.of("a") is by_model.of("a") and by_model.of("b") is not by_model.of("a")
    for i in range(MODELS_KEPT + 5):
        by_model.of(f"m{i}")
    assert by_model.of("a")._seen == deque()  # a model not asked lately starts again
