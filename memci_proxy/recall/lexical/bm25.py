"""An incremental Okapi BM25 index over archived pages (pure: no I/O, no clock).

Scoring, for a query with unique terms ``t`` (weight ``w_t``, 1 for plain text queries)::

    score(D) = sum_t  w_t * idf(t) * tf(t, D) * (k1 + 1) / (tf(t, D) + k1 * (1 - b + b * |D| / avgdl))
    idf(t)   = ln(1 + (N - n_t + 0.5) / (n_t + 0.5))

``N`` is the number of documents, ``n_t`` those containing ``t``, ``|D|`` a document's length in terms,
``avgdl`` the mean length. The idf is the non-negative form (as in Lucene), so a term present in most
pages lowers no score. Scores are raw, not normalised: seed 001's threshold (``min_score=0.2``)
applies to them directly. Defaults follow seed 001: ``k1=1.2``, ``b=0.75``.

Search is term-at-a-time over postings, rarest terms first, with MaxScore-style pruning (exact top k);
``max_terms`` optionally caps a long query to its rarest terms (approximate, bounded cost).

Documents are identified by any hashable ``doc_id`` that msgspec can encode (``int`` or ``str``); adding an
id that is present replaces its document. ``to_bytes``/``from_bytes`` (msgpack) let a caller cache an
index per conversation.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import msgspec

from memci_proxy.recall.lexical.text import tokenize

__all__ = ["BM25Index", "DocId", "DEFAULT_K1", "DEFAULT_B", "DEFAULT_MIN_SCORE"]

DocId = int | str

DEFAULT_K1 = 1.2
DEFAULT_B = 0.75
DEFAULT_MIN_SCORE = 0.2
_STATE_VERSION = 1


class _State(msgspec.Struct, array_like=True):
    """Serialised index: the postings as they are in memory (no re-tokenising, no re-inversion on load)."""

    version: int
    k1: float
    b: float
    slots: list[int]  # internal slot of each document, insertion order
    doc_ids: list[DocId]  # parallel to slots
    lengths: list[int]  # length by slot (0 for free slots)
    postings: dict[str, dict[int, int]]  # term -> {slot: term frequency}


class BM25Index:
    """Inverted index: term -> {internal slot: term frequency}; scores accumulated over postings."""

    def __init__(
        self,
        k1: float = DEFAULT_K1,
        b: float = DEFAULT_B,
        tokenizer: Callable[[str], list[str]] = tokenize,
    ) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1 = k1
        self.b = b
        self._tokenize = tokenizer
        self._postings: dict[str, dict[int, int]] = {}
        self._slot_of: dict[DocId, int] = {}
        self._id_of: dict[int, DocId] = {}
        # slot -> {term: tf}, needed by remove(); None after loading until first needed (built from postings)
        self._terms_of: dict[int, dict[str, int]] | None = {}
        self._length: list[int] = []
        self._total_length = 0
        self._next_slot = 0
        self._norm: list[float] | None = None  # per-slot k1 * (1 - b + b * |D| / avgdl), rebuilt lazily

    # -- contents -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._slot_of

    @property
    def doc_ids(self) -> list[DocId]:
        """Indexed ids in insertion order."""
        return list(self._slot_of)

    @property
    def vocabulary_size(self) -> int:
        return len(self._postings)

    @property
    def average_length(self) -> float:
        return self._total_length / len(self._slot_of) if self._slot_of else 0.0

    def document_frequency(self, term: str) -> int:
        return len(self._postings.get(term, ()))

    def documents_with(self, term: str) -> list[DocId]:
        """Ids of the documents holding ``term`` (cost: its document frequency)."""
        id_of = self._id_of
        return [id_of[slot] for slot in self._postings.get(term, ())]

    def holds(self, doc_id: DocId, term: str) -> bool:
        """Whether document ``doc_id`` holds ``term``."""
        slot = self._slot_of.get(doc_id)
        return slot is not None and slot in self._postings.get(term, ())

    def idf(self, term: str) -> float:
        n = self.document_frequency(term)
        return math.log(1.0 + (len(self._slot_of) - n + 0.5) / (n + 0.5))

    # -- updates --------------------------------------------------------------------------------
    def add(self, doc_id: DocId, text: str) -> None:
        """Index ``text`` under ``doc_id`` (replacing an earlier document with the same id)."""
        self.add_terms(doc_id, self._tokenize(text))

    def add_terms(self, doc_id: DocId, terms: Iterable[str]) -> None:
        """Index an already tokenized document."""
        self._insert(doc_id, dict(Counter(terms)))

    def remove(self, doc_id: DocId) -> bool:
        """Drop ``doc_id``; False when it was not indexed."""
        slot = self._slot_of.get(doc_id)
        if slot is None:
            return False
        document_terms = self._document_terms().pop(slot)
        del self._slot_of[doc_id]
        del self._id_of[slot]
        for term in document_terms:
            postings = self._postings[term]
            del postings[slot]
            if not postings:
                del self._postings[term]
        self._total_length -= self._length[slot]
        self._length[slot] = 0
        self._norm = None
        if not self._slot_of:  # reclaim the slot table once empty
            self._length.clear()
            self._next_slot = 0
        return True

    def _insert(self, doc_id: DocId, term_counts: dict[str, int]) -> None:
        if doc_id in self._slot_of:
            self.remove(doc_id)
        slot = self._next_slot
        self._next_slot += 1
        self._slot_of[doc_id] = slot
        self._id_of[slot] = doc_id
        if self._terms_of is not None:
            self._terms_of[slot] = term_counts
        length = sum(term_counts.values())
        self._length.append(length)
        self._total_length += length
        postings = self._postings
        for term, count in term_counts.items():
            bucket = postings.get(term)
            if bucket is None:
                postings[term] = {slot: count}
            else:
                bucket[slot] = count
        self._norm = None

    # -- search ---------------------------------------------------------------------------------
    def search(
        self,
        query: str,
        k: int = 10,
        min_score: float = DEFAULT_MIN_SCORE,
        max_terms: int | None = None,
    ) -> list[tuple[DocId, float]]:
        """Top ``k`` documents for a free-text query, best first, raw score >= ``min_score``.

        ``max_terms`` keeps only that many query terms, those of highest idf (the rarest), which bounds
        the cost of long queries; None scores every term.
        """
        weights = dict.fromkeys(self._tokenize(query), 1.0)
        return self.search_weighted(weights, k=k, min_score=min_score, max_terms=max_terms)

    def search_weighted(
        self,
        term_weights: Mapping[str, float],
        k: int = 10,
        min_score: float = DEFAULT_MIN_SCORE,
        max_terms: int | None = None,
        within: Collection[DocId] | None = None,
    ) -> list[tuple[DocId, float]]:
        """Top ``k`` documents for weighted (already tokenized) query terms, best first.

        Terms with a weight <= 0 are ignored; ``max_terms`` keeps the terms of largest weight * idf.
        Equal scores rank the earlier indexed document first; every id appears at most once. Scores are
        exactly those of ``score_all`` over the kept terms: the pruning below only skips documents that
        provably cannot reach the top ``k`` or ``min_score``. ``within``: only those documents are ranked (each
        term costs the shorter of its postings and ``within``).
        """
        if k <= 0 or not self._slot_of:
            return []
        if within is None:
            scores = self._accumulate(term_weights, k, min_score, max_terms)
        else:
            slot_of = self._slot_of
            scores = self._accumulate_within(term_weights, {slot_of[d] for d in within if d in slot_of}, max_terms)
        best = heapq.nlargest(k, ((s, -slot) for slot, s in scores.items() if s >= min_score))
        return [(self._id_of[-neg_slot], score) for score, neg_slot in best]

    def score_all(self, term_weights: Mapping[str, float]) -> dict[int, float]:
        """Raw BM25 score of every document matching at least one term, by internal slot."""
        return self._accumulate(term_weights, None, float("-inf"), None)

    def _accumulate(
        self, term_weights: Mapping[str, float], k: int | None, min_score: float, max_terms: int | None
    ) -> dict[int, float]:
        """Term-at-a-time scoring, rarest (highest-impact) terms first, with MaxScore-style pruning.

        A term contributes less than ``factor = weight * idf * (k1 + 1)`` to any document. Once the
        factors of the terms still to come add up to less than the k-th best partial score (or than
        ``min_score``), a document not yet seen cannot make the cut, so the remaining terms only update
        documents already accumulated. Summation order is the same with and without pruning.
        """
        norm = self._norm if self._norm is not None else self._rebuild_norm()
        plan = self._plan(term_weights, max_terms)
        remaining = math.fsum(factor for factor, _, _ in plan)
        postings_to_go = sum(len(postings) for _, _, postings in plan)
        scores: dict[int, float] = {}
        get = scores.get
        pruning = False
        for factor, _, postings in plan:
            remaining -= factor
            postings_to_go -= len(postings)
            if pruning:
                if len(scores) < len(postings):
                    lookup = postings.get
                    for slot, partial in scores.items():
                        tf = lookup(slot)
                        if tf:
                            scores[slot] = partial + factor * tf / (tf + norm[slot])
                else:
                    for slot, tf in postings.items():
                        partial = get(slot)
                        if partial is not None:
                            scores[slot] = partial + factor * tf / (tf + norm[slot])
                continue
            for slot, tf in postings.items():
                scores[slot] = get(slot, 0.0) + factor * tf / (tf + norm[slot])
            # Deciding costs a pass over the accumulator: worth it only if it may save longer passes.
            if k is not None and postings_to_go > len(scores):
                threshold = min_score
                if len(scores) >= k:
                    threshold = max(threshold, heapq.nlargest(k, scores.values())[-1])
                # small margin: 'remaining' is a float running difference
                pruning = remaining * (1.0 + 1e-9) + 1e-12 < threshold
        return scores

    def _plan(self, term_weights: Mapping[str, float], max_terms: int | None
              ) -> list[tuple[float, str, dict[int, int]]]:
        """(factor, term, postings) of the query's terms held by the index, highest factor first."""
        n_docs = len(self._slot_of)
        k1_plus_1 = self.k1 + 1.0
        plan: list[tuple[float, str, dict[int, int]]] = []
        for term, weight in term_weights.items():
            postings = self._postings.get(term)
            if postings and weight > 0:
                n = len(postings)
                plan.append((weight * math.log(1.0 + (n_docs - n + 0.5) / (n + 0.5)) * k1_plus_1, term, postings))
        plan.sort(key=lambda item: (-item[0], item[1]))
        if max_terms is not None:
            del plan[max(max_terms, 0) :]
        return plan

    def _accumulate_within(self, term_weights: Mapping[str, float], slots: set[int], max_terms: int | None
                           ) -> dict[int, float]:
        """The scores ``_accumulate`` gives (same terms, same order), of the documents in ``slots`` only."""
        norm = self._norm if self._norm is not None else self._rebuild_norm()
        scores: dict[int, float] = {}
        get = scores.get
        for factor, _, postings in self._plan(term_weights, max_terms):
            if len(postings) <= len(slots):
                held = [(slot, tf) for slot, tf in postings.items() if slot in slots]
            else:
                held = [(slot, postings[slot]) for slot in slots if slot in postings]
            for slot, tf in held:
                scores[slot] = get(slot, 0.0) + factor * tf / (tf + norm[slot])
        return scores

    def _rebuild_norm(self) -> list[float]:
        avgdl = self.average_length or 1.0
        k1, b = self.k1, self.b
        base, slope = k1 * (1.0 - b), k1 * b / avgdl
        self._norm = [base + slope * length for length in self._length]
        return self._norm

    def _document_terms(self) -> dict[int, dict[str, int]]:
        if self._terms_of is None:
            terms_of: dict[int, dict[str, int]] = {slot: {} for slot in self._id_of}
            for term, postings in self._postings.items():
                for slot, tf in postings.items():
                    terms_of[slot][term] = tf
            self._terms_of = terms_of
        return self._terms_of

    # -- serialisation --------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """Plain-data snapshot (lists and dicts; postings keyed by internal slot). Shares no mutable data."""
        return {
            "version": _STATE_VERSION,
            "k1": self.k1,
            "b": self.b,
            "slots": list(self._slot_of.values()),
            "doc_ids": list(self._slot_of),
            "lengths": list(self._length),
            "postings": {term: dict(postings) for term, postings in self._postings.items()},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], tokenizer: Callable[[str], list[str]] = tokenize) -> BM25Index:
        """Inverse of ``to_state`` (the caller's containers are not kept)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported BM25 index state version {state.get('version')!r}")
        postings = {term: {int(k): int(v) for k, v in p.items()} for term, p in state["postings"].items()}
        return cls._assemble(
            float(state["k1"]), float(state["b"]), list(state["slots"]), list(state["doc_ids"]),
            [int(n) for n in state["lengths"]], postings, tokenizer,
        )

    def to_bytes(self) -> bytes:
        """msgpack encoding of the index, for a per-conversation cache."""
        return msgspec.msgpack.encode(
            _State(
                _STATE_VERSION,
                self.k1,
                self.b,
                list(self._slot_of.values()),
                list(self._slot_of),
                self._length,
                self._postings,
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes, tokenizer: Callable[[str], list[str]] = tokenize) -> BM25Index:
        state = msgspec.msgpack.decode(data, type=_State)
        if state.version != _STATE_VERSION:
            raise ValueError(f"unsupported BM25 index state version {state.version!r}")
        return cls._assemble(state.k1, state.b, state.slots, state.doc_ids, state.lengths, state.postings, tokenizer)

    @classmethod
    def _assemble(
        cls,
        k1: float,
        b: float,
        slots: list[int],
        doc_ids: list[DocId],
        lengths: list[int],
        postings: dict[str, dict[int, int]],
        tokenizer: Callable[[str], list[str]],
    ) -> BM25Index:
        if len(slots) != len(doc_ids) or len(set(doc_ids)) != len(doc_ids) or len(set(slots)) != len(slots):
            raise ValueError("inconsistent BM25 index state: ids and slots")
        if any(not 0 <= slot < len(lengths) for slot in slots):
            raise ValueError("inconsistent BM25 index state: slot out of range")
        index = cls(k1=k1, b=b, tokenizer=tokenizer)
        index._slot_of = dict(zip(doc_ids, slots))
        index._id_of = dict(zip(slots, doc_ids))
        index._length = lengths
        index._total_length = sum(lengths[slot] for slot in slots)
        index._next_slot = len(lengths)
        index._postings = postings
        index._terms_of = None
        return index
