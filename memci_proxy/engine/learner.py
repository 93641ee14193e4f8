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

The fit belongs to one conversation and lives in its state (`CountFit`, `ConversationState.counts`): every replica
plans a conversation's turn with the costs learned from that conversation's own answers, whichever process relayed
them, so two replicas alternating turns plan byte-identical prompts. Its features are the plain estimate's (a
function of the prompt alone, not of what one process has counted exactly).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec

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


class CountFit(msgspec.Struct, kw_only=True, frozen=True):
    """One conversation's learned costs and the forgetting sums they are fitted from (see `CountLearner`)."""

    model: str = ""
    xx: list[float] = msgspec.field(default_factory=list)  # len(FEATURES)**2, row by row
    xy: list[float] = msgspec.field(default_factory=list)
    observations: int = 0
    answers: int = 0  # answers offered, learnt from or not
    coefficients: list[float] = msgspec.field(default_factory=lambda: list(PRIOR))
    under: float = 0.0


def _well_formed(fit: CountFit) -> bool:
    n = len(FEATURES)
    return len(fit.xx) == n * n and len(fit.xy) == n and len(fit.coefficients) == n


def fit_learner(fit: CountFit) -> CountLearner:
    learner = CountLearner()
    if _well_formed(fit):
        n = len(FEATURES)
        learner._xx = [list(fit.xx[i * n:(i + 1) * n]) for i in range(n)]
        learner._xy = list(fit.xy)
        learner.observations, learner.answers = fit.observations, fit.answers
        learner.coefficients, learner.under = tuple(fit.coefficients), fit.under
    return learner


def learner_fit(model: str, learner: CountLearner) -> CountFit:
    return CountFit(model=model, xx=[v for row in learner._xx for v in row], xy=list(learner._xy),
                    observations=learner.observations, answers=learner.answers,
                    coefficients=list(learner.coefficients), under=learner.under)


def fit_of(fit: CountFit | None, model: str) -> CountFit | None:
    """The fit when it was learned for this model (a conversation that changes model starts again)."""
    return fit if fit is not None and fit.model == model else None


def fit_ready(fit: CountFit | None, model: str) -> bool:
    """Whether a turn for `model` plans with the learned costs: the fit has seen enough answers."""
    fit = fit_of(fit, model)
    return fit is not None and fit.observations >= MIN_OBSERVATIONS


def fit_counter(fit: CountFit | None, model: str, base: TokenCounter) -> TokenCounter:
    """The learned counter once the conversation's fit for `model` has seen enough answers, else `base`."""
    if not fit_ready(fit, model):
        return base
    return fit_learner(fit).counter(base)


def fit_wants(fit: CountFit | None, model: str) -> bool:
    """Whether the next answer is learnt from: every one at first, every `SETTLED_EVERY`-th once settled (reading
    the whole prompt's features costs about as much as planning it)."""
    fit = fit_of(fit, model)
    if fit is None:
        return True
    return fit.observations < SETTLED_AFTER or (fit.answers + 1) % SETTLED_EVERY == 0


def fit_answer(fit: CountFit | None, model: str, features: Features | None, reported: int) -> CountFit:
    """The fit after one answer: counted, and learnt from when `features` are given (see `fit_wants`)."""
    fit = fit_of(fit, model)
    if fit is not None and features is None and _well_formed(fit):  # only counted: the sums stay as they are
        return msgspec.structs.replace(fit, answers=fit.answers + 1)
    learner = CountLearner() if fit is None else fit_learner(fit)
    if fit is not None:
        learner.answers += 1
    if features is not None:
        learner.observe(features, reported)
    return learner_fit(model, learner)
