"""Entity terms of a text (pure): proper nouns, numbers and codes, the words mem0-style retrieval boosts.

A proper noun is a capitalised word that does not start a sentence (after ``.``, ``!``, ``?``, a line break or
an opening quote, a capital says nothing); a number or code is any word holding a digit (``7349``, ``gpt4``,
``2023-05-02``). The result is in the search's terms (memci_proxy.recall.lexical.text.tokenize), so it can weight a
query.
"""

from __future__ import annotations

import re

from memci_proxy.recall.lexical.text import tokenize

__all__ = ["entity_terms", "boosted_query"]

_CAPITALISED = re.compile(r"\b[A-Z][\w'’-]*")
_WITH_DIGIT = re.compile(r"\b[\w-]*\d[\w-]*")
_SENTENCE_START = frozenset(".!?\n\"“'(:")


def entity_terms(text: str) -> set[str]:
    terms: set[str] = set()
    for match in _CAPITALISED.finditer(text):
        before = text[: match.start()].rstrip()
        if before and before[-1] not in _SENTENCE_START and match.group() != "I":
            terms.update(tokenize(match.group()))
    for match in _WITH_DIGIT.finditer(text):
        terms.update(tokenize(match.group()))
    return terms


def boosted_query(weights: dict[str, float], text: str, boost: float) -> dict[str, float]:
    """``weights`` (term -> weight) with the entity terms of ``text`` multiplied by ``boost``."""
    if boost == 1.0:
        return dict(weights)
    entities = entity_terms(text)
    return {term: weight * boost if term in entities else weight for term, weight in weights.items()}
