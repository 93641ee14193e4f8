"""Pieces of loadtests/eval_recall.py shared by its data sets: the reference BM25 (``rank_bm25``, a library
the project does not use for its own search), a packaged embedding model as an EmbedFn, a progress line,
and MemoryBank's labelled probing questions (loadtests/memorybank_evidence.json).

MemoryBank protocol: each exchange (the user's message and the answer) of a user's dated history is a page;
each labelled probing question is a query, asked as written, on the day of the history's last exchange (what
"on May 2nd" refers to: proxy.recall.dates); the relevant pages are the labelled ones.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from loadtests.evaldata import MemoryBankUser
from loadtests.progress import progress
from proxy.recall.bm25 import BM25Index
from proxy.recall.dates import asked_days, prefer_days
from proxy.recall.entities import boosted_query
from proxy.recall.fusion import fuse_lexical_and_vector, rank_by_cosine
from proxy.recall.packaged_models import DEFAULT_MODEL
from proxy.recall.text import tokenize

__all__ = ["EVIDENCE_FILE", "reference_ranking", "local_embed", "memorybank_cases",
           "evaluate_memorybank", "page_text"]

EVIDENCE_FILE = Path(__file__).with_name("memorybank_evidence.json")
Row = tuple[float, float, float, float, float]


def reference_ranking(documents: Sequence[str], query_terms: Sequence[str]) -> list[int]:
    """Best-first document positions by rank_bm25's BM25Okapi (its defaults k1=1.5, b=0.75), with the project's
    tokenizer, so that only the scoring differs; documents scoring 0 are left out."""
    from rank_bm25 import BM25Okapi

    model = BM25Okapi([tokenize(d) or ["\u2205"] for d in documents])
    scores = model.get_scores(list(query_terms))
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    return [i for i in order if scores[i] > 0]


def local_embed(model: str = DEFAULT_MODEL) -> Callable[[list[str]], list[list[float]]]:
    """An EmbedFn over a packaged model (proxy.recall.packaged_models), as the proxy runs it (chunking included)."""
    from proxy.recall.local_embedder import LocalEmbedder

    embedder = LocalEmbedder(model)

    def embed(texts: list[str]) -> list[list[float]]:
        got = embedder._embed_now(texts)
        if got is None:
            raise RuntimeError(f"the packaged embedding model failed: {embedder.last_failure}")
        return got

    return embed


def page_text(user: MemoryBankUser, position: int) -> str:
    exchange = user.exchanges[position]
    return f"[{exchange.date}] {exchange.query}\n{exchange.response}"


def memorybank_cases(users: list[MemoryBankUser], path: Path = EVIDENCE_FILE) -> list[tuple[MemoryBankUser, str, list[int]]]:
    """(user, question, relevant exchange positions) of every labelled question."""
    labels = json.loads(path.read_text(encoding="utf-8"))["labels"]
    cases = []
    for user in users:
        for index, relevant in sorted(labels.get(user.name, {}).items(), key=lambda kv: int(kv[0])):
            cases.append((user, user.probing_questions[int(index)], [int(r) for r in relevant]))
    return cases


def evaluate_memorybank(
    users: list[MemoryBankUser],
    embed: Callable[[list[str]], list[list[float]]] | None,
    score: Callable[[Sequence[object], Sequence[object]], Row],
    vector_weight: float = 1.0,
    min_cosine: float | None = 0.2,
    entity_boost: float = 1.0,
    bars: bool | None = None,
    dates: bool = True,
) -> dict[str, list[Row]]:
    """Rows per ranking (lexical, reference-bm25, and vector and fused when ``embed`` is given); ``bars``: as
    loadtests.progress.progress (None: no progress); ``dates``: the pages of the days a question names climb the
    lexical and fused rankings, as in the proxy's search."""
    cases = memorybank_cases(users)
    rows: dict[str, list[Row]] = {"lexical": [], "reference-bm25": []}
    if embed is not None:
        rows["vector"], rows["fused"] = [], []
    indexes: dict[str, tuple[BM25Index, list[str], dict[int, list[float]]]] = {}
    searching = progress(len(cases), "MemoryBank: searching", bars, "questions")
    for user, question, relevant in cases:
        searching.advance()
        if user.name not in indexes:
            texts = [page_text(user, i) for i in range(len(user.exchanges))]
            index = BM25Index()
            for i, text in enumerate(texts):
                index.add(i, text)
            vectors = dict(enumerate(embed(texts))) if embed is not None else {}
            indexes[user.name] = (index, texts, vectors)
        index, texts, vectors = indexes[user.name]
        weights = boosted_query(dict.fromkeys(tokenize(question), 1.0), question, entity_boost)
        lexical = [(int(i), s) for i, s in index.search_weighted(weights, k=len(texts))]
        days = {i: dt.date.fromisoformat(e.date) for i, e in enumerate(user.exchanges)}
        span = asked_days(question, max(days.values())) if dates else None
        if span is not None:
            lexical = prefer_days(lexical, days.get, span, keep_scores=True)
        rows["lexical"].append(score([i for i, _ in lexical], relevant))
        rows["reference-bm25"].append(score(reference_ranking(texts, tokenize(question)), relevant))
        if embed is not None:
            vector = rank_by_cosine(embed([question])[0], vectors, k=len(vectors))
            fused = fuse_lexical_and_vector(lexical, vector, limit=len(texts), vector_weight=vector_weight,
                                            min_cosine=min_cosine)
            if span is not None:
                fused = prefer_days(fused, days.get, span)
            rows["vector"].append(score([i for i, _ in vector], relevant))
            rows["fused"].append(score([i for i, _ in fused], relevant))
    searching.close()
    return rows
