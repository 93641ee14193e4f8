"""Retrieval quality of the recall search on MADial-Bench (and a look at MemoryBank's probing questions).

MADial-Bench protocol (as in the benchmark's own retrieval scripts): for each dialogue, the candidate
memories are those of the dialogue's user; the query is built from the dialogue *before* the first test
turn (the turn at which the assistant should bring the memory up); the labels (``relevant-id``) are used
only to score the ranking.

Metrics, averaged over dialogues:

* ``recall@k``: share of the relevant memories found in the top k (the benchmark's definition; with
  several relevant memories recall@1 cannot reach 1).
* ``hit@k``: 1 when at least one relevant memory is in the top k (success@k).
* ``mrr``: reciprocal rank of the first relevant memory (0 when none is retrieved).

Usage::

    python loadtests/evals/eval_recall.py                       # MADial-Bench and MemoryBank: fused with the packaged
                                                          # model, lexical, and rank_bm25's BM25, side by side
    python loadtests/evals/eval_recall.py --local-model wordllama-l2-256   # another packaged model
    python loadtests/evals/eval_recall.py --lexical-only --strategy all   # lexical, every query strategy
    python loadtests/evals/eval_recall.py --strategy weighted   # one strategy
    python loadtests/evals/eval_recall.py --embeddings-url http://127.0.0.1:8011   # adds vector and fused runs
    python loadtests/evals/eval_recall.py --embeddings-url http://127.0.0.1:8011 --split dev --vector-weight 0.5 1 2
    (an embeddings server over a real model: loadtests/embeddings_server.py)

Measured (2026-11, ``--strategy weighted --min-cosine 0.2``, all-MiniLM-L6-v2 served by
loadtests/embeddings_server.py, all 160 dialogues)::

    lexical  recall@1=0.305 recall@5=0.563 hit@5=0.794 mrr=0.618
    vector   recall@1=0.298 recall@5=0.581 hit@5=0.825 mrr=0.661
    fused    recall@1=0.329 recall@5=0.653 hit@5=0.881 mrr=0.697   (weights 1:1)

The emulator's hashed bag-of-words embeddings as the vector half make the fusion worse than lexical alone
(fused recall@5 0.421): what fusion adds comes from a semantic model.
    python loadtests/evals/eval_recall.py --memorybank          # MemoryBank probing questions (unlabelled)
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadtests.evals.eval_sets import (embedded_text, evaluate_memorybank, local_embed, reference_ranking,
                                       search_rankings)
from loadtests.evals.evaldata import MadialBench, MadialDialogue, MemoryBankUser, load_madial_bench, load_memorybank
from loadtests.progress import add_argument as add_progress_argument
from loadtests.progress import bars_wanted, progress
from memci_proxy.recall.lexical.bm25 import DEFAULT_MIN_SCORE, BM25Index
from memci_proxy.recall.lexical.entities import boosted_query
from memci_proxy.recall.vectors.packaged_models import DEFAULT_MODEL, MODELS
from memci_proxy.recall.lexical.text import tokenize

__all__ = [
    "EmbedFn",
    "RetrievalMetrics",
    "STRATEGIES",
    "VECTOR_QUERIES",
    "caching",
    "vector_query_text",
    "build_query",
    "evaluate_madial",
    "score_ranking",
    "http_embedder",
    "main",
]

EmbedFn = Callable[[list[str]], list[list[float]]]

STRATEGIES = ("last-user", "recent-3", "context", "weighted")
DEFAULT_STRATEGY = "weighted"
_ASSISTANT_WEIGHT = 0.5  # the user's own words are the stronger signal of what to remember


@dataclass(frozen=True, slots=True)
class RetrievalMetrics:
    queries: int
    recall_at_1: float
    recall_at_5: float
    hit_at_1: float
    hit_at_5: float
    mrr: float

    def line(self, label: str) -> str:
        return (
            f"{label:<28} n={self.queries:<4} recall@1={self.recall_at_1:.3f} recall@5={self.recall_at_5:.3f} "
            f"hit@1={self.hit_at_1:.3f} hit@5={self.hit_at_5:.3f} mrr={self.mrr:.3f}"
        )


def score_ranking(ranking: Sequence[object], relevant: Sequence[object]) -> tuple[float, float, float, float, float]:
    """(recall@1, recall@5, hit@1, hit@5, reciprocal rank) of one best-first ranking."""
    wanted = set(relevant)
    if not wanted:
        raise ValueError("a query needs at least one relevant id")

    def found(k: int) -> int:
        return len(wanted.intersection(ranking[:k]))

    first = next((i for i, doc_id in enumerate(ranking, start=1) if doc_id in wanted), None)
    return (
        found(1) / len(wanted),
        found(5) / len(wanted),
        float(found(1) > 0),
        float(found(5) > 0),
        1.0 / first if first else 0.0,
    )


def _mean_metrics(rows: list[tuple[float, float, float, float, float]]) -> RetrievalMetrics:
    n = len(rows)
    if n == 0:
        return RetrievalMetrics(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    sums = [sum(column) for column in zip(*rows)]
    return RetrievalMetrics(n, *(s / n for s in sums))


def build_query(dialogue: MadialDialogue, strategy: str = DEFAULT_STRATEGY) -> dict[str, float]:
    """Weighted query terms from the dialogue before its first test turn (no labels involved)."""
    turns = [t for t in dialogue.turns_before(dialogue.test_turns[0]) if t.text]
    if not turns:
        return {}
    user_turns = [t for t in turns if t.speaker not in (None, "Assistant")]
    weights: Counter[str] = Counter()
    if strategy == "last-user":
        chosen = user_turns[-1:] or turns[-1:]
        for term in tokenize(chosen[0].text):
            weights[term] = 1.0
    elif strategy == "recent-3":
        for turn in turns[-3:]:
            for term in tokenize(turn.text):
                weights[term] = 1.0
    elif strategy == "context":
        for turn in turns:
            for term in tokenize(turn.text):
                weights[term] = 1.0
    elif strategy == "weighted":
        # Every turn before the test turn; the user's turns count fully, the assistant's by half; a term's
        # summed weight v is saturated as 2v / (v + 1) so that repetition helps but cannot dominate.
        summed: Counter[str] = Counter()
        for turn in turns:
            turn_weight = _ASSISTANT_WEIGHT if turn.speaker == "Assistant" else 1.0
            for term in tokenize(turn.text):
                summed[term] += turn_weight
        for term, value in summed.items():
            weights[term] = 2.0 * value / (value + 1.0)
    else:
        raise ValueError(f"unknown query strategy {strategy!r}; one of {', '.join(STRATEGIES)}")
    return dict(weights)


VECTOR_QUERIES = ("context", "user", "recent-3")


def vector_query_text(dialogue: MadialDialogue, mode: str = "context") -> str:
    """The text embedded as the query: every turn before the test turn, the user's turns only, or the last 3."""
    turns = [t for t in dialogue.turns_before(dialogue.test_turns[0]) if t.text]
    if mode == "user":
        turns = [t for t in turns if t.speaker not in (None, "Assistant")] or turns
    elif mode == "recent-3":
        turns = turns[-3:]
    elif mode != "context":
        raise ValueError(f"unknown vector query {mode!r}; one of {', '.join(VECTOR_QUERIES)}")
    return "\n".join(t.text for t in turns)


def caching(embed: EmbedFn) -> EmbedFn:
    """An EmbedFn that asks ``embed`` only for texts it has not seen (several runs over the same data)."""
    memo: dict[str, list[float]] = {}

    def cached(texts: list[str]) -> list[list[float]]:
        missing = list(dict.fromkeys(t for t in texts if t not in memo))
        if missing:
            memo.update(zip(missing, embed(missing), strict=True))
        return [memo[t] for t in texts]

    return cached


def evaluate_madial(
    bench: MadialBench,
    strategy: str = DEFAULT_STRATEGY,
    limit: int | None = None,
    embed: EmbedFn | None = None,
    min_score: float = DEFAULT_MIN_SCORE,
    vector_weight: float = 1.0,
    min_cosine: float = 0.2,
    vector_query: str = "context",
    bars: bool | None = None,
    reference: bool = False,
    entity_boost: float = 1.0,
) -> dict[str, RetrievalMetrics]:
    """Metrics of lexical search (and of vector and fused search when ``embed`` is given).

    ``limit`` evaluates only the first dialogues (a quick slice for CI). The rankings are the recall search's
    (loadtests.evals.eval_sets.search_rankings: lexical, vector, default and archive) with ``vector_weight`` and
    ``min_cosine``. ``reference`` adds
    rank_bm25's BM25Okapi over the same memories, queried with every word before the test turn.
    """
    dialogues = bench.dialogues[:limit] if limit is not None else bench.dialogues
    users = sorted({d.user_id for d in dialogues})
    indexes: dict[int, BM25Index] = {}
    memory_vectors: dict[int, dict[int, list[float]]] = {}
    indexing = progress(len(users), f"{strategy}: indexing users' memories", bars, "users")
    for user_id in users:
        indexing.advance()
        memories = bench.memories_of(user_id)
        index = BM25Index()
        for memory in memories:
            index.add(memory.id, memory.event)
        indexes[user_id] = index
        if embed is not None:
            vectors = embed([embedded_text(m.event) for m in memories])
            memory_vectors[user_id] = {m.id: v for m, v in zip(memories, vectors, strict=True)}
    indexing.close()
    query_texts = [vector_query_text(d, vector_query) for d in dialogues]
    query_vectors: list[list[float]] = embed(query_texts) if embed is not None else []

    rows: dict[str, list[tuple[float, float, float, float, float]]] = {"lexical": []}
    if reference:
        rows["reference-bm25"] = []
    if embed is not None:
        rows["vector"], rows["default"], rows["user-first"], rows["archive"] = [], [], [], []
    searching = progress(len(dialogues), f"{strategy}: searching", bars, "dialogues")
    for position, dialogue in enumerate(dialogues):
        searching.advance()
        index = indexes[dialogue.user_id]
        weights = build_query(dialogue, strategy)
        if entity_boost != 1.0:
            weights = boosted_query(weights, vector_query_text(dialogue, "context"), entity_boost)
        if reference:
            memories = bench.memories_of(dialogue.user_id)
            terms = tokenize(vector_query_text(dialogue, "context"))
            ranked = reference_ranking([m.event for m in memories], terms)
            rows["reference-bm25"].append(score_ranking([memories[i].id for i in ranked], dialogue.relevant_ids))
        rankings = search_rankings(index, "", weights, query_vectors[position] if embed is not None else None,
                                   memory_vectors.get(dialogue.user_id, {}), min_cosine=min_cosine,
                                   vector_weight=vector_weight)
        if min_score != DEFAULT_MIN_SCORE:
            rankings["lexical"] = [d for d, _ in index.search_weighted(weights, k=len(index), min_score=min_score)]
        for name, ranking in rankings.items():
            rows[name].append(score_ranking(ranking, dialogue.relevant_ids))
    searching.close()
    return {name: _mean_metrics(r) for name, r in rows.items()}


def http_embedder(url: str, model: str = "embedding", batch: int = 64, timeout: float = 30.0) -> EmbedFn:
    """An EmbedFn over an OpenAI-compatible ``/v1/embeddings`` endpoint at ``url`` (base URL or full path)."""
    import httpx

    endpoint = url.rstrip("/")
    if not endpoint.endswith("/embeddings"):
        endpoint += "/embeddings" if endpoint.endswith("/v1") else "/v1/embeddings"

    def embed(texts: list[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        with httpx.Client(timeout=timeout) as client:
            for start in range(0, len(texts), batch):
                chunk = texts[start : start + batch]
                response = client.post(endpoint, json={"model": model, "input": chunk})
                response.raise_for_status()
                data = sorted(response.json()["data"], key=lambda item: item.get("index", 0))
                if len(data) != len(chunk):
                    raise RuntimeError(f"{endpoint} returned {len(data)} embeddings for {len(chunk)} inputs")
                vectors.extend([list(map(float, item["embedding"])) for item in data])
        return vectors

    return embed


def _memorybank_report(users: list[MemoryBankUser], top: int = 3, width: int = 100) -> None:
    """Probing questions carry no labels: print what the search returns, for reading, and the coverage."""
    asked = answered = 0
    for user in users:
        index = BM25Index()
        for i, exchange in enumerate(user.exchanges):
            index.add(i, f"{exchange.query}\n{exchange.response}")
        print(f"\n## {user.name} ({len(user.exchanges)} exchanges)")
        for question in user.probing_questions:
            hits = index.search(question, k=top)
            asked += 1
            answered += bool(hits)
            print(f"Q: {question}")
            for doc_id, score in hits:
                exchange = user.exchanges[int(doc_id)]
                print(f"   {score:6.2f} [{exchange.date}] {exchange.query[:width]}")
    print(f"\nquestions with at least one hit >= {DEFAULT_MIN_SCORE}: {answered}/{asked}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategy", choices=(*STRATEGIES, "all"), default=DEFAULT_STRATEGY)
    parser.add_argument("--limit", type=int, default=None, help="only the first N dialogues")
    parser.add_argument(
        "--split",
        choices=("all", "dev", "test"),
        default="all",
        help="dev: even-numbered dialogues (used to choose the 'weighted' query); test: odd-numbered (held out)",
    )
    parser.add_argument("--min-score", type=float, default=DEFAULT_MIN_SCORE)
    parser.add_argument("--embeddings-url", default=None,
                        help="OpenAI-compatible base URL serving /v1/embeddings (default: the packaged model)")
    parser.add_argument("--embeddings-model", default="embedding")
    parser.add_argument("--local-model", default=DEFAULT_MODEL, choices=sorted(MODELS),
                        help="packaged model of the vector half when no --embeddings-url")
    parser.add_argument("--lexical-only", action="store_true", help="no vector half (no embedding model)")
    parser.add_argument("--vector-weight", type=float, nargs="+", default=[1.0],
                        help="weight(s) of the vector ranking in the fusion (several: one fused run each)")
    parser.add_argument("--user-weight", type=int, default=2,
                        help="MemoryBank: times the user's words count in a page's terms (the proxy's recall_user_weight)")
    parser.add_argument("--min-cosine", type=float, default=0.2, help="vector candidates below it are not fused")
    parser.add_argument("--vector-query", choices=VECTOR_QUERIES, default="context", help="text embedded as the query")
    parser.add_argument("--entity-boost", type=float, default=2.0,
                        help="weight of proper nouns, numbers and codes in the BM25 query (the proxy's default)")
    parser.add_argument("--no-dates", action="store_true",
                        help="MemoryBank: pages of the days a question names do not climb (the proxy's default: they do)")
    parser.add_argument("--memorybank", action="store_true", help="print MemoryBank probing-question results")
    add_progress_argument(parser)
    args = parser.parse_args(argv)

    if args.memorybank:
        users = load_memorybank()
        if users is None:
            print("MemoryBank data not found (set MEMCI_EVAL_DIR)", file=sys.stderr)
            return 2
        _memorybank_report(users)
        return 0

    bench = load_madial_bench()
    if bench is None:
        print("MADial-Bench data not found (set MEMCI_EVAL_DIR)", file=sys.stderr)
        return 2
    if args.split != "all":
        bench = MadialBench(bench.dialogues[0 if args.split == "dev" else 1 :: 2], bench.memories)
    if args.lexical_only:
        embed, source = None, "none"
    elif args.embeddings_url:
        embed, source = caching(http_embedder(args.embeddings_url, model=args.embeddings_model)), args.embeddings_url
    else:
        embed, source = caching(local_embed(args.local_model)), f"packaged {args.local_model}"
    strategies = STRATEGIES if args.strategy == "all" else (args.strategy,)
    print(
        f"MADial-Bench en ({args.split}): {len(bench.dialogues)} dialogues, {len(bench.memories)} memories, "
        f"min_score={args.min_score}, embeddings: {source}, min_cosine={args.min_cosine}, "
        f"entity_boost={args.entity_boost}"
    )
    for strategy in strategies:
        for position, vector_weight in enumerate(args.vector_weight if embed is not None else [1.0]):
            results = evaluate_madial(
                bench,
                strategy=strategy,
                limit=args.limit,
                embed=embed,
                min_score=args.min_score,
                vector_weight=vector_weight,
                min_cosine=args.min_cosine,
                vector_query=args.vector_query,
                bars=bars_wanted(args.progress),
                reference=position == 0,
                entity_boost=args.entity_boost,
            )
            for name, metrics in results.items():
                if position and name not in FUSED:
                    continue  # the other runs do not depend on the weight
                label = f"{name} [{strategy}]" + (f" w={vector_weight:g}" if name in FUSED else "")
                print(metrics.line(label))
    users = load_memorybank()
    if users is None:
        print("MemoryBank data not found: skipped")
        return 0
    print(f"MemoryBank en: labelled probing questions of loadtests/{EVIDENCE_NAME}, pages = dated exchanges")
    for position, vector_weight in enumerate(args.vector_weight if embed is not None else [1.0]):
        rows = evaluate_memorybank(users, embed, score_ranking, vector_weight=vector_weight,
                                   min_cosine=args.min_cosine, entity_boost=args.entity_boost,
                                   user_weight=args.user_weight,
                                   bars=bars_wanted(args.progress), dates=not args.no_dates)
        for name, values in rows.items():
            if position and name not in FUSED:
                continue
            label = name + (f" w={vector_weight:g}" if name in FUSED else "")
            print(_mean_metrics(values).line(label))
    return 0


EVIDENCE_NAME = "memorybank_evidence.json"
FUSED = ("default", "user-first", "archive")

if __name__ == "__main__":
    raise SystemExit(main())
