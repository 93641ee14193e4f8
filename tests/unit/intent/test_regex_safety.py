"""Catastrophic-backtracking probes against every regex client text reaches.

Costs are compared with a baseline measured in the same run (CPU time), never with a fixed number of seconds:
- the intent rules read at most ``MAX_MESSAGE_CHARS`` of a message: every rule, and the whole rewrite, on
  hostile text of that size costs at most a bounded multiple of rewriting an ordinary message;
- the tokenizers, the keyword extractor, the token estimates and the markup quoting read text of any size:
  hostile text eight times longer costs at most about eight times more (linear, not quadratic).
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable

import pytest

from memci_proxy.engine import intent, markup, tokens
from memci_proxy.engine.intent import MAX_MESSAGE_CHARS, rewrite_rules
from memci_proxy.recall.push import memory_block as memory
from memci_proxy.recall.lexical import text

HISTORY = [{"role": "user", "content": "Tell me about the Eiffel Tower in Paris."},
           {"role": "assistant", "content": "It is a wrought-iron lattice tower built in 1889 for the World's Fair."}]
ORDINARY = ("How tall is it and when was that built? Tell me more about its history. " * 40)[:MAX_MESSAGE_CHARS - 10]
ATOMS = ["a", " ", "-", "'", "1", ".", ",", "?", "!", "\n", "\t", "它", "这", "呢", "x_", "what about ", "and ",
         "it ", "that ", "<", "[", "#", "[page ", "<memci-context"]


def probes(size: int) -> dict[str, str]:
    out = {f"{a!r}*": a * (size // len(a)) for a in ATOMS}
    for a, b in itertools.product(["a", " ", "-", "1", "它", "what about ", "x"], [" ", "!", "?", ".", "a", "_", "\n"]):
        out[f"{a!r}*+{b!r}"] = a * ((size - 8) // len(a)) + b * 4 + "x"
        out[f"({a!r}{b!r})*"] = (a + b) * (size // len(a + b))
    out["what about, spaces, x"] = "what about a" + " " * (size - 20) + "b too?"
    out["what else, spaces"] = "what else" + " " * (size - 12) + "?"
    out["word_ that"] = "a" * (size - 20) + "_ that is it?"
    out["and, spaces"] = "and " + " " * (size - 10) + "x?"
    return {k: v[:size] for k, v in out.items()}


def cpu(fn: Callable[[], object], repeat: int = 3) -> float:
    """CPU seconds of this thread alone (a background thread of another test, e.g. a model loading, must not count)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.thread_time()
        fn()
        best = min(best, time.thread_time() - started)
    return best


def patterns(*modules) -> dict[str, re.Pattern]:
    return {f"{m.__name__}.{name}": value for m in modules for name, value in vars(m).items()
            if isinstance(value, re.Pattern)}


# Rules that only ever read a window of the text (the word before a pronoun).
READ_LIMIT = {"memci_proxy.engine.intent._PREVIOUS_WORD": intent.PREVIOUS_WORD_WINDOW}


def test_every_intent_rule_on_hostile_text_of_the_largest_size_read():
    ordinary = cpu(lambda: rewrite_rules(HISTORY, ORDINARY))
    allowed = 20 * ordinary + 0.02
    slow = []
    for name, pattern in patterns(intent).items():
        for label, probe in probes(READ_LIMIT.get(name, MAX_MESSAGE_CHARS)).items():
            cost = cpu(lambda: (pattern.search(probe), pattern.match(probe), pattern.findall(probe)), repeat=1)
            if cost > allowed:
                slow.append((name, label, round(cost, 3)))
    assert slow == [], f"over {allowed:.3f} s (20 x an ordinary rewrite): {slow}"


@pytest.mark.parametrize("as_history", [False, True], ids=["latest-message", "history"])
def test_the_rewrite_of_hostile_messages_costs_a_bounded_multiple_of_an_ordinary_one(as_history: bool):
    ordinary = cpu(lambda: rewrite_rules(HISTORY, ORDINARY))
    slow = []
    for label, probe in probes(MAX_MESSAGE_CHARS).items():
        if as_history:
            history = [{"role": "user", "content": probe[:600]}, {"role": "assistant", "content": probe}]
            cost = cpu(lambda: rewrite_rules(history, ORDINARY), repeat=1)
        else:
            cost = cpu(lambda: rewrite_rules(HISTORY, probe), repeat=1)
        if cost > 20 * ordinary + 0.02:
            slow.append((label, round(cost, 3)))
    assert slow == [], f"ordinary rewrite {ordinary:.4f} s; slow: {slow}"


UNBOUNDED: dict[str, Callable[[str], object]] = {
    "tokenize": text.tokenize,
    "keywords": text.keywords,
    "memory.estimate_tokens": memory.estimate_tokens,
    "engine.count_text": tokens.EstimateCounter().count_text,
    "markup.quote": markup.quote,
    "markup.escape_tags": markup.escape_tags,
    **{name: (lambda s, p=p: (p.findall(s), p.search(s))) for name, p in patterns(text, memory, tokens, markup).items()},
}


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_text_of_any_size_costs_linear_time(name: str):
    fn = UNBOUNDED[name]
    small, large = probes(10_000), probes(80_000)
    worst = []
    for label in small:
        a = cpu(lambda: fn(small[label]), repeat=2)
        b = cpu(lambda: fn(large[label]), repeat=2)
        if b > 0.01 and b > 24 * max(a, 0.0003):  # 8x the text: linear ~8x, quadratic ~64x
            worst.append((label, round(a, 4), round(b, 4)))
    assert worst == [], worst
