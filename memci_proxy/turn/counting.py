"""How a managed turn counts tokens: the base count and the per-model costs learned from the upstream.

The base count is `tokenizer_file` when set, else the upstream's `/tokenize` (cached, see
`memci_proxy.upstream.tokenize`) when enabled, else the estimate. Per conversation (in its state, shared by the
replicas), `memci_proxy.engine.learner` learns the costs of text, images, the tools' schema and the chat template from
each answer's reported `prompt_tokens`; once it has seen a few answers, the turn plans with them (a safety margin
included).

A plan counts only with what every replica counts alike (`SharedCounts`): the upstream's count of a text the turn
waits for (a long one), else the plain estimate; not the counts this process alone cached (short texts counted
behind a turn, answers it relayed) nor its ratio of exact to estimated counts. So the same conversation state gives
the same plan on any replica.

An answer's text is counted by the upstream already: when the answer is one plain assistant message (no tool
calls, no reasoning; whole or streamed), its `completion_tokens` (the end-of-turn token included where the upstream counts it: the
safe side) stand for the text's count, and the client's next request, which sends the text back, asks
`/tokenize` for its own new texts only: those a plan counts exactly, and a sample of the shorter ones
(`TurnCounts.worth_asking`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from memci_proxy.engine import Plan, TokenCounter
from memci_proxy.engine.learner import LearnedCounter, fit_answer, fit_counter, fit_ready, fit_wants, request_features
from memci_proxy.engine.state import ConversationState
from memci_proxy.engine.tokens import IMAGE_TOKENS, MESSAGE_OVERHEAD, EstimateCounter, make_counter, message_texts
from memci_proxy.metrics import Metrics
from memci_proxy.settings import Settings
from memci_proxy.upstream.tokenize import UpstreamTokenCounter, text_key


_decode = msgspec.json.Decoder().decode
# Texts shorter than a plan counts exactly are asked of /tokenize only to keep the exact/estimate ratio current (the
# ratio follows about the last 50 texts counted): every one of the process's first CALIBRATION_TEXTS, then one in
# SAMPLE_EVERY. An agent's tool outputs and a chat's longer messages (and a benchmark's canned answers, which the
# proxy did not relay) cost a request each otherwise.
CALIBRATION_TEXTS = 32
SAMPLE_EVERY = 8


def answer_text_count(body: bytes) -> tuple[str, int] | None:
    """The text of a whole (not streamed) answer and its completion tokens, when the answer is one plain assistant
    message whose completion tokens are its text's count; None otherwise."""
    try:
        data = _decode(body)
    except msgspec.DecodeError:
        return None
    choices = data.get("choices") if isinstance(data, dict) else None
    usage = data.get("usage") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict) or not isinstance(
            usage, dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict) or choice.get("finish_reason") not in ("stop", "length"):
        return None
    content = message.get("content")
    if not isinstance(content, str) or message.get("tool_calls") or message.get("reasoning_content"):
        return None
    return text_count(content, usage)


def text_count(text: str, usage: dict[str, Any] | None) -> tuple[str, int] | None:
    """A plain answer's text and its completion tokens, unless the upstream counted reasoning tokens in them."""
    if not isinstance(usage, dict):
        return None
    count, details = usage.get("completion_tokens"), usage.get("completion_tokens_details")
    if isinstance(details, dict) and details.get("reasoning_tokens"):
        return None
    return (text, count) if isinstance(count, int) and count > 0 else None


def new_texts(system: list[dict[str, Any]], messages: list[dict[str, Any]], known: int) -> list[str]:
    """The texts a turn counts for the first time: its system messages' and those past the known prefix."""
    out: list[str] = []
    for message in [*system, *messages[max(0, known):]]:
        out.extend(message_texts(message)[0])
    return out


def learned_ratio(state: ConversationState, model: str, base: TokenCounter) -> float:
    """The correction ratio when the conversation's learned costs take over from the plain estimate.

    The ratio was learned of the plain estimate's whole error, a tools' schema it counts at half included; the
    learned costs carry that error from now on (the tools and the turn's new texts are counted with them), and kept
    whole on top of them the ratio would count it twice (an agent's fixed part planned at 1.4 times its size, refused
    where it fits). What is still counted plainly (the system message until the next epoch, the older entries) is
    text: it needs the learned cost of text, no more. So the ratio becomes that cost (with the learned margin), never
    above what it was nor below 1; floored at 1 from now on, it then settles as the answers report.
    """
    counter = fit_counter(state.counts, model, base)
    unit = counter.text_unit if isinstance(counter, LearnedCounter) else 1.0
    return max(1.0, min(state.correction_ratio, unit))


class SharedCounts:
    """The base count of a plan: the upstream's count of a text at least `min_chars` long (a turn waits for those on
    arrival, on whichever replica), else the plain estimate (a `TokenCounter` with `lookup`)."""

    def __init__(self, tokenizer: UpstreamTokenCounter, min_chars: int) -> None:
        self.tokenizer = tokenizer
        self.min_chars = min_chars
        self.estimate = EstimateCounter()

    def lookup(self, text: str) -> int | None:
        return self.tokenizer.lookup(text) if len(text) >= self.min_chars else None

    def count_text(self, text: str) -> int:
        exact = self.lookup(text) if text else None
        return exact if exact is not None else self.estimate.count_text(text)

    def count_message(self, message: dict[str, Any]) -> int:
        texts, others = message_texts(message)
        return MESSAGE_OVERHEAD + others * IMAGE_TOKENS + sum(self.count_text(t) for t in texts)


class TurnCounts:
    def __init__(self, settings: Settings, upstream: Any, metrics: Metrics) -> None:
        self.metrics = metrics
        self.tokenizer: UpstreamTokenCounter | None = None
        if not settings.tokenizer_file and settings.upstream_tokenize:
            self.tokenizer = UpstreamTokenCounter(upstream, settings.tokenize_cache_entries,
                                                  settings.tokenize_timeout_s, metrics,
                                                  wait_min_chars=settings.tokenize_wait_min_chars,
                                                  min_chars=settings.tokenize_min_chars)
        self.base: TokenCounter = make_counter(settings.tokenizer_file)
        self.shared: TokenCounter = self.base  # what a plan counts with (the same on every replica)
        if self.tokenizer is not None:  # not `or`: an empty cache has len() 0
            self.base = self.tokenizer
            self.shared = SharedCounts(self.tokenizer, max(settings.tokenize_wait_min_chars, self.tokenizer.min_chars))
        self.learning = settings.count_learning

    async def counter_for(self, model: str, system: list[dict[str, Any]], messages: list[dict[str, Any]],
                          known_prefix: int, state: ConversationState | None = None) -> TokenCounter:
        """The counter a turn plans with: the shared base count, with the costs the conversation learned (the new
        texts' upstream counts fetched first, waited for when long)."""
        if self.tokenizer is not None:
            await self.tokenizer.prefetch(self.worth_asking(new_texts(system, messages, known_prefix)), model)
        if not self.learning or state is None:
            return self.shared
        return fit_counter(state.counts, model, self.shared)

    def worth_asking(self, texts: list[str]) -> list[str]:
        """The new texts worth a `/tokenize` request: those a plan counts exactly (``SharedCounts.min_chars`` and
        longer), and a sample of the shorter ones, which plans estimate and whose counts only keep the counter's
        exact/estimate ratio current: all of them until the process has counted ``CALIBRATION_TEXTS`` texts, then one
        in ``SAMPLE_EVERY`` (by its hash, so a text resent is asked or not alike)."""
        tokenizer, shared = self.tokenizer, self.shared
        if tokenizer is None or not isinstance(shared, SharedCounts) or tokenizer.counted < CALIBRATION_TEXTS:
            return texts
        return [t for t in texts if len(t) >= shared.min_chars or text_key(t) % SAMPLE_EVERY == 0]

    async def prompt_tokens(self, model: str, messages: list[dict[str, Any]], tools_json: str,
                            state: ConversationState | None = None) -> int:
        """A whole prompt's count as a turn's first plan counts it, with the costs the conversation learned (an API's
        token-counting endpoint)."""
        counter = await self.counter_for(model, [], messages, 0, state)
        return sum(counter.count_message(m) for m in messages) + self.tools_tokens(counter, tools_json)

    def answered(self, body: bytes) -> None:
        """A whole answer of one round: its text's count, from its completion tokens, kept for the next turn."""
        if self.tokenizer is not None:
            self._remember(answer_text_count(body))

    def answered_stream(self, text: str, usage: dict[str, Any] | None) -> None:
        """A streamed answer of one round (its text as relayed): counted by its completion tokens, as a whole one."""
        if self.tokenizer is not None:
            self._remember(text_count(text, usage))

    def _remember(self, counted: tuple[str, int] | None) -> None:
        """Not a text plans count exactly: another replica would ask /tokenize for it (a count without the
        end-of-turn token), and the two would plan apart."""
        if counted is not None and self.tokenizer is not None and not (
                isinstance(self.shared, SharedCounts) and len(counted[0]) >= self.shared.min_chars):
            self.tokenizer.remember(*counted)

    @staticmethod
    def tools_tokens(counter: TokenCounter, tools_json: str) -> int:
        """The tools' schema, and with learned counts the template's fixed preamble too."""
        if isinstance(counter, LearnedCounter):
            return counter.count_tools(tools_json)
        return counter.count_text(tools_json) if tools_json else 0

    @staticmethod
    def text_unit(counter: TokenCounter | None) -> float:
        """Planned tokens per base-count token of text (recall results are counted in base counts)."""
        return counter.text_unit if isinstance(counter, LearnedCounter) else 1.0

    def learn(self, model: str, plan: Plan, tools_json: str, reported: int,
              state: ConversationState) -> ConversationState:
        """The state after the upstream's prompt_tokens are learnt from (after the answer: the features read the
        whole prompt, by the plain estimate); the metric keeps the planned estimate's error."""
        if plan.estimated_tokens <= 0:  # (a plan over its budget went upstream as planned too)
            return state
        self.metrics.estimate_error.observe((plan.estimated_tokens - reported) / reported)
        if not self.learning:
            return state
        features = request_features(plan.messages, tools_json) if fit_wants(state.counts, model) else None
        ready = fit_ready(state.counts, model)
        state = msgspec.structs.replace(state, counts=fit_answer(state.counts, model, features, reported))
        if not ready and fit_ready(state.counts, model):
            state = msgspec.structs.replace(state, correction_ratio=learned_ratio(state, model, self.shared))
        return state

    async def close(self) -> None:
        if self.tokenizer is not None:
            await self.tokenizer.close()
