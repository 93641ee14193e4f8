"""Token counts learned per model from the upstream's reported `prompt_tokens`.

The estimate (`tokens.EstimateCounter`) counts text by characters, an image at a flat `IMAGE_TOKENS`, a fixed
overhead per message and the tools' JSON as text. The upstream knows better: every answer reports the
prompt's `usage.prompt_tokens`. `CountLearner` fits, per model,

    reported ~ a*text + a'*exact + b*images + c*tools + d*messages + e

(text, tools: the estimate's raw counts; exact: text an exact base counter knew, e.g. the upstream's /tokenize
cache, kept apart because its cost per counted token differs from the estimate's; images and messages: how many)
by least squares with exponential forgetting and a ridge prior at the flat costs, so the first observations move
it gently and a model that never sends images keeps the flat image cost. `counter()` then counts with the
learned costs, times a safety margin that grows with the fit's recent under-estimates: the estimate stays on the
high side of the truth.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .memo import SizedMemo
from .tokens import IMAGE_TOKENS, MESSAGE_OVERHEAD, EstimateCounter, TokenCounter, message_texts

FEATURES = ("text", "exact", "images", "tools", "messages", "bias")
PRIOR = (1.0, 1.0, float(IMAGE_TOKENS), 1.0, float(MESSAGE_OVERHEAD), 0.0)
# Prior weights: the strength of the prior as the square of each feature's typical size, so that one
# observation of a typical request weighs about as much as the prior on every coefficient.
_TYPICAL = (2000.0, 2000.0, 2.0, 500.0, 20.0, 1.0)
PRIOR_STRENGTH = 0.5
FORGETTING = 0.97  # each older observation weighs 3% less: about the last 30 answers count
BOUNDS = ((0.25, 4.0), (0.25, 4.0), (1.0, 8192.0), (0.25, 4.0), (0.0, 64.0), (0.0, 4096.0))
MIN_OBSERVATIONS = 2
SETTLED_AFTER = 20  # observations after which a model learns from every `SETTLED_EVERY`-th answer only
SETTLED_EVERY = 8
LEARNER_BYTES = 4096  # about what one CountLearner holds (a 6x6 matrix of floats and a few more), rounded up
MARGIN_BASE = 0.03  # the least safety margin on a learned count
MARGIN_MAX = 0.5
UNDER_DECAY = 0.9  # the remembered worst under-estimate fades by 10% per observation


@dataclass(frozen=True)
class Features:
    """What the estimate sees of one upstream request."""

    text: int
    images: int
    tools: int
    messages: int
    exact: int = 0  # text counted by an exact base counter (not the estimate)

    def vector(self) -> tuple[float, ...]:
        return (float(self.text), float(self.exact), float(self.images), float(self.tools), float(self.messages), 1.0)


def split_count(base: TokenCounter, text: str) -> tuple[int, bool]:
    """The base count of a text and whether it is exact (a base with `lookup`: a cache of exact counts)."""
    lookup = getattr(base, "lookup", None)
    if lookup is not None:
        exact = lookup(text)
        if exact is not None:
            return exact, True
    return base.count_text(text), False


def request_features(messages: list[dict[str, Any]], tools_json: str = "",
                     base: TokenCounter | None = None) -> Features:
    """The features of a request as sent upstream: base counts (estimated and exact apart), images and messages."""
    base = base or EstimateCounter()
    lookup, count_text = getattr(base, "lookup", None), base.count_text  # as split_count, looked up once
    text = exact = images = 0
    for message in messages:
        texts, others = message_texts(message)
        for t in texts:
            count = lookup(t) if lookup is not None else None
            if count is not None:
                exact += count
            else:
                text += count_text(t)
        images += others
    tools = split_count(base, tools_json)[0] if tools_json else 0  # schema: one cost, exact or not
    return Features(text, images, tools, len(messages), exact)


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(rhs)
    a = [row[:] + [rhs[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(col + 1, n):
            f = a[r][col] / a[col][col]
            if f:
                for c in range(col, n + 1):
                    a[r][c] -= f * a[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (a[r][n] - sum(a[r][c] * out[c] for c in range(r + 1, n))) / a[r][r]
    return out


class CountLearner:
    """The learned costs of one model (see the module docstring)."""

    def __init__(self) -> None:
        n = len(FEATURES)
        self._xx = [[0.0] * n for _ in range(n)]
        self._xy = [0.0] * n
        self.observations = 0
        self.answers = 0  # answers offered (`wants`), learnt from or not
        self.coefficients: tuple[float, ...] = PRIOR
        self.under = 0.0  # the worst recent relative under-estimate of the fit (0 = none)

    def predict(self, features: Features) -> float:
        return sum(c * x for c, x in zip(self.coefficients, features.vector()))

    @property
    def margin(self) -> float:
        return min(MARGIN_MAX, MARGIN_BASE + self.under)

    @property
    def ready(self) -> bool:
        return self.observations >= MIN_OBSERVATIONS

    def observe(self, features: Features, reported: int) -> float | None:
        """Learn from one answer. Returns the relative error of the prediction made before it (None the first time)."""
        if reported <= 0:
            return None
        error = None
        if self.observations:
            predicted = self.predict(features) * (1.0 + self.margin)
            error = (predicted - reported) / reported
            self.under = max(self.under * UNDER_DECAY, (reported - self.predict(features)) / reported)
        x = features.vector()
        n = len(x)
        for i in range(n):
            self._xy[i] = FORGETTING * self._xy[i] + x[i] * reported
            row = self._xx[i]
            for j in range(n):
                row[j] = FORGETTING * row[j] + x[i] * x[j]
        self.observations += 1
        weights = [PRIOR_STRENGTH * t * t for t in _TYPICAL]
        matrix = [[self._xx[i][j] + (weights[i] if i == j else 0.0) for j in range(n)] for i in range(n)]
        rhs = [self._xy[i] + weights[i] * PRIOR[i] for i in range(n)]
        solved = _solve(matrix, rhs)
        if solved is not None and all(math.isfinite(v) for v in solved):
            self.coefficients = tuple(min(hi, max(lo, v)) for v, (lo, hi) in zip(solved, BOUNDS))
        return error

    def counter(self, base: TokenCounter | None = None) -> "LearnedCounter":
        return LearnedCounter(base or EstimateCounter(), self.coefficients, self.margin)


class LearnedCounter:
    """Counts with a model's learned costs and a safety margin (a `TokenCounter`)."""

    def __init__(self, base: TokenCounter, coefficients: tuple[float, ...], margin: float) -> None:
        self.base = base
        self.text_cost, self.exact_cost, self.image_cost, self.tools_cost, self.message_cost, self.bias = coefficients
        self.scale = 1.0 + margin

    def _text(self, text: str) -> float:
        count, exact = split_count(self.base, text)
        return count * (self.exact_cost if exact else self.text_cost)

    @property
    def text_unit(self) -> float:
        """Planned tokens per base-count token of text, at most (exact or estimated)."""
        return max(self.text_cost, self.exact_cost) * self.scale

    def count_text(self, text: str) -> int:
        return math.ceil(self._text(text) * self.scale) if text else 0

    def count_message(self, message: dict[str, Any]) -> int:
        texts, images = message_texts(message)
        raw = sum(self._text(t) for t in texts if t)
        return math.ceil((raw + self.image_cost * images + self.message_cost) * self.scale)

    def count_tools(self, tools_json: str) -> int:
        """The tools' schema plus the template's fixed preamble (the fit's constant term)."""
        raw = self.tools_cost * self.base.count_text(tools_json) if tools_json else 0.0
        return math.ceil((raw + self.bias) * self.scale)


class ModelCounts:
    """A `CountLearner` per model, the least recently used forgotten past `max_models` or past their bytes (the
    model's name is the client's: a learner's bytes are its name's plus LEARNER_BYTES; bounded per process)."""

    def __init__(self, max_models: int = 64) -> None:
        self.max_models = max(1, max_models)
        self._models: SizedMemo[str, CountLearner] = SizedMemo(
            self.max_models, self.max_models * (LEARNER_BYTES + 256), lambda model, _learner: len(model) + LEARNER_BYTES)

    def __len__(self) -> int:
        return len(self._models)

    def get(self, model: str) -> CountLearner | None:
        return self._models.get(model)

    def wants(self, model: str) -> bool:
        """Whether to learn from this answer: every one at first, every `SETTLED_EVERY`-th once settled (reading
        the whole prompt's features costs about as much as planning it)."""
        learner = self._models.get(model)
        if learner is None:
            return True
        learner.answers += 1
        return learner.observations < SETTLED_AFTER or learner.answers % SETTLED_EVERY == 0

    def counter(self, model: str, base: TokenCounter) -> TokenCounter:
        """The model's learned counter once it has seen enough answers, else `base`."""
        learner = self.get(model)
        return learner.counter(base) if learner is not None and learner.ready else base

    def observe(self, model: str, features: Features, reported: int) -> float | None:
        learner = self._models.get(model)
        if learner is None:
            learner = CountLearner()
            self._models.put(model, learner)
        return learner.observe(features, reported)
