"""Per-model token costs learned from the upstream's reported prompt_tokens (memci_proxy.engine.learner)."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from memci_proxy.engine.learner import (
    IMAGE_TOKENS, CountFit, CountLearner, Features, LearnedCounter, fit_answer, fit_counter, fit_wants, request_features,
)
from memci_proxy.engine.tokens import EstimateCounter


def upstream(f: Features, text=1.9, image=66, tools=1.1, message=5, bias=12) -> int:
    """An upstream whose true costs differ from the estimate's (more tokens per char, images far cheaper)."""
    return int(text * f.text + image * f.images + tools * f.tools + message * f.messages + bias)


def random_features(rng: random.Random) -> Features:
    return Features(rng.randint(100, 8000), rng.randint(0, 24), rng.choice((0, 350)), rng.randint(2, 120))


def test_converges_to_the_upstream_costs():
    learner = CountLearner()
    rng = random.Random(1)
    for _ in range(80):
        f = random_features(rng)
        learner.observe(f, upstream(f))
    text, _, image, tools, message, _ = learner.coefficients
    assert abs(text - 1.9) < 0.05
    assert abs(image - 66) < 6, image
    assert abs(tools - 1.1) < 0.2
    assert learner.ready


def test_a_model_without_images_keeps_the_flat_image_cost():
    learner = CountLearner()
    rng = random.Random(2)
    for _ in range(40):
        f = Features(rng.randint(100, 8000), 0, 0, rng.randint(2, 80))
        learner.observe(f, upstream(f))
    assert learner.coefficients[2] == IMAGE_TOKENS


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(1.0, 3.0), st.integers(20, 400))
def test_after_learning_the_estimate_stays_on_the_safe_side(seed, text_cost, image_cost):
    """Once learned, the counter (with its margin) never counts fewer tokens than the upstream reports."""
    rng = random.Random(seed)
    learner = CountLearner()
    for _ in range(40):
        f = random_features(rng)
        learner.observe(f, upstream(f, text=text_cost, image=image_cost))
    for _ in range(20):
        f = random_features(rng)
        truth = upstream(f, text=text_cost, image=image_cost)
        assert learner.predict(f) * (1 + learner.margin) >= truth * 0.99


def test_noise_widens_the_margin():
    rng = random.Random(3)
    calm, noisy = CountLearner(), CountLearner()
    for _ in range(60):
        f = random_features(rng)
        calm.observe(f, upstream(f))
        noisy.observe(f, int(upstream(f) * rng.uniform(0.85, 1.15)))
    assert noisy.margin > calm.margin >= 0.03


def test_counter_counts_with_the_learned_costs_and_the_margin():
    counter = LearnedCounter(EstimateCounter(), (2.0, 1.0, 66.0, 1.0, 5.0, 10.0), 0.05)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    message = {"role": "user", "content": [{"type": "text", "text": "abcd" * 25}, image]}  # 25 estimated text tokens
    assert counter.count_message(message) == math.ceil((2 * 25 + 66 + 5) * 1.05)
    assert counter.count_text("abcd" * 25) == math.ceil(50 * 1.05)
    assert counter.count_tools("") == math.ceil(10 * 1.05)


def test_request_features_count_images_messages_and_tools():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4000}}
    messages = [{"role": "system", "content": "x" * 40},
                {"role": "user", "content": [{"type": "text", "text": "y" * 8}, image, image]}]
    f = request_features(messages, '{"a": 1}')
    assert f == Features(text=12, images=2, tools=2, messages=2)  # the image bytes are not text


def test_a_conversation_fit_is_per_model_and_round_trips_through_the_state():
    from memci_proxy.engine.state import ConversationState

    base = EstimateCounter()
    f = Features(1000, 2, 0, 10)
    fit = fit_answer(None, "a", f, 1500)
    assert fit_counter(fit, "a", base) is base  # one answer: not ready yet
    fit = fit_answer(fit, "a", f, 1500)
    assert isinstance(fit_counter(fit, "a", base), LearnedCounter)
    assert fit_counter(fit, "b", base) is base  # learned for another model
    assert fit_answer(fit, "b", f, 1500).observations == 1  # a new model starts again
    state = ConversationState.from_bytes(ConversationState(counts=fit).to_bytes())
    assert state.counts == fit
    again = fit_counter(state.counts, "a", base)
    assert again.count_text("some text here") == fit_counter(fit, "a", base).count_text("some text here")


def test_an_answer_not_learnt_from_only_counts_it():
    from memci_proxy.engine.learner import fit_learner, learner_fit

    fit = fit_answer(fit_answer(None, "a", Features(1000, 2, 0, 10), 1500), "a", Features(800, 0, 3, 12), 1300)
    counted = fit_answer(fit, "a", None, 1400)
    rebuilt = fit_learner(fit)
    rebuilt.answers += 1
    assert counted == learner_fit("a", rebuilt)  # the same fit as through the learner, one more answer
    assert counted.answers == fit.answers + 1 and counted.observations == fit.observations
    malformed = CountFit(model="a", xx=[1.0], observations=3, answers=4)
    fresh = fit_learner(malformed)
    fresh.answers += 1
    assert fit_answer(malformed, "a", None, 100) == learner_fit("a", fresh)  # another shape: read as the learner does
    assert fresh.answers == 1


class ExactFor(EstimateCounter):
    """A base counter that knows some texts exactly (like the /tokenize cache)."""

    def __init__(self, known: dict[str, int]) -> None:
        self.known = known

    def lookup(self, text: str) -> int | None:
        return self.known.get(text)


def test_exact_and_estimated_text_are_learned_apart():
    """Texts the base counts exactly cost ~1 per counted token; estimated ones ~1.9: a mix must not blur them."""
    rng = random.Random(5)
    learner = CountLearner()
    for _ in range(80):
        f = Features(rng.randint(100, 4000), rng.randint(0, 5), 0, rng.randint(2, 60), exact=rng.randint(100, 4000))
        learner.observe(f, int(1.9 * f.text + 1.0 * f.exact + 66 * f.images + 5 * f.messages + 12))
    text, exact, *_ = learner.coefficients
    assert abs(text - 1.9) < 0.1 and abs(exact - 1.0) < 0.1
    known = "the upstream knows this text"
    base = ExactFor({known: 5})
    counter = LearnedCounter(base, learner.coefficients, 0.0)
    assert counter.count_text(known) == math.ceil(5 * exact)
    other = "an estimated text of some length"
    assert counter.count_text(other) == math.ceil(base.count_text(other) * text)
    features = request_features([{"role": "user", "content": known}, {"role": "user", "content": other}], base=base)
    assert (features.exact, features.text) == (5, base.count_text(other))


def test_a_settled_model_learns_from_one_answer_in_four():
    from memci_proxy.engine.learner import SETTLED_AFTER, SETTLED_EVERY

    fit = None
    f = Features(1000, 0, 0, 10)
    learnt = 0
    for _ in range(SETTLED_AFTER + 40):
        wanted = fit_wants(fit, "m")
        fit = fit_answer(fit, "m", f if wanted else None, 1500)
        learnt += wanted
    assert learnt == SETTLED_AFTER + 40 // SETTLED_EVERY
