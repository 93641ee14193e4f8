"""RecallResolver.search fused with a vector ranking (fake embedder, in-memory vector store), and its fallbacks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from memci_proxy.engine import EstimateCounter
from memci_proxy.engine.state import ARCHIVED, ConversationState, PageRecord
from memci_proxy.recall.search.fusion import cosine_similarity
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.vectors.index import PageVectors, text_digest

# Pages: one message each. Page 3 speaks of the cat only with words no query below uses ("feline", "kitten").
PAGES = {
    1: "We booked the train to Lyon for the conference in March.",
    2: "My sister's wedding is in June; I need a blue suit.",
    3: "Our kitten Miso is a shy feline who hides under the sofa.",
    4: "The quarterly report about train delays is due on Friday.",
}
TOPICS = {"cat": ("kitten", "feline", "cat", "pet", "miso"), "train": ("train", "lyon", "rail"),
          "wedding": ("wedding", "suit", "sister")}


class TopicEmbedder:
    """Vectors over three topics (what a semantic model would see): 'cat' and 'kitten' land together."""

    def __init__(self) -> None:
        self.dimension: int | None = None
        self.last_failure: str | None = None
        self.calls: list[list[str]] = []
        self.failing = False

    @property
    def model_name(self) -> str:
        return "topics"

    async def embed(self, texts: Sequence[str]) -> list[list[float]] | None:
        self.calls.append(list(texts))
        if self.failing:
            self.last_failure = "timeout"
            return None
        self.dimension = len(TOPICS)
        out = []
        for text in texts:
            words = text.lower().replace(".", " ").replace(";", " ").split()
            vector = [sum(w.startswith(k) for w in words for k in keys) + 0.01 for keys in TOPICS.values()]
            norm = math.sqrt(sum(x * x for x in vector))
            out.append([x / norm for x in vector])
        return out


class MemoryVectorStore:
    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, str], tuple[str, list[float]]] = {}
        self.index_dims: list[int] = []
        self.broken = False

    async def put_page_vectors(self, tenant: str, conversation_id: str, model: str, vectors: Any) -> int:
        if self.broken:
            raise ConnectionError("database down")
        for number, digest, vector in vectors:
            self.rows[(conversation_id, number, model)] = (digest, list(vector))
        return len(vectors)

    async def page_vector_digests(self, tenant: str, conversation_id: str, model: str) -> dict[str, str]:
        return {n: d for (c, n, m), (d, _) in self.rows.items() if c == conversation_id and m == model}

    async def nearest_pages(self, tenant: str, conversation_id: str, model: str, query: Any, k: int = 10,
                            exact: bool = True) -> list[tuple[str, float]]:
        if self.broken:
            raise ConnectionError("database down")
        scored = [(n, cosine_similarity(query, v)) for (c, n, m), (_, v) in self.rows.items()
                  if c == conversation_id and m == model and len(v) == len(query)]
        return sorted(scored, key=lambda p: -p[1])[:k]

    async def ensure_vector_index(self, dim: int) -> str:
        self.index_dims.append(dim)
        return f"ix_{dim}"


class FakeMetrics:
    def __init__(self) -> None:
        from prometheus_client import Counter

        self.recall_fallbacks = Counter("fallbacks", "f", ["reason"], registry=CollectorRegistry())

    def count(self, reason: str) -> float:
        return self.recall_fallbacks.labels(reason)._value.get()


def _context(pages: dict[int, str], conversation_id: str = "c1") -> RecallContext:
    messages = [{"role": "user", "content": text} for text in pages.values()]
    records = [PageRecord(number=n, part=1, start=i, end=i + 1, tokens=20, status=ARCHIVED)
               for i, n in enumerate(pages)]
    return RecallContext("t1", conversation_id, ConversationState(pages=records), messages)


def _resolver(embedder: TopicEmbedder | None, store: MemoryVectorStore, metrics: FakeMetrics, **kw: Any):
    vectors = PageVectors(store, embedder, inline_pages=kw.pop("inline_pages", 32)) if embedder else None
    return RecallResolver(None, EstimateCounter(), 2048, vectors=vectors, metrics=metrics, **kw), vectors


async def test_fused_search_finds_a_page_that_shares_no_word_with_the_query() -> None:
    store, metrics, embedder = MemoryVectorStore(), FakeMetrics(), TopicEmbedder()
    resolver, _ = _resolver(embedder, store, metrics)
    ctx = _context(PAGES)
    lexical_only, _ = _resolver(None, MemoryVectorStore(), FakeMetrics())
    assert "3" not in [label for label, _ in await lexical_only.search(ctx, "my cat pet", 3)]
    hits = await resolver.search(ctx, "my cat pet", 3)
    labels = [label for label, _ in hits]
    assert labels[0] == "3"
    assert len(labels) == len(set(labels))  # de-duplicated
    assert store.index_dims == [3]  # HNSW index asked for once the dimension is known
    # Pages and query went in one request: the query first.
    assert embedder.calls[0][0] == "my cat pet" and len(embedder.calls[0]) == 1 + len(PAGES)
    assert metrics.count("timeout") == 0


async def test_a_page_found_by_both_rankings_comes_first() -> None:
    resolver, _ = _resolver(TopicEmbedder(), MemoryVectorStore(), FakeMetrics())
    hits = await resolver.search(_context(PAGES), "train to Lyon", 4)
    assert hits[0][0] == "1"
    assert {label for label, _ in hits} >= {"1", "4"}


async def test_pages_are_embedded_once_and_again_when_their_text_changes() -> None:
    store, embedder = MemoryVectorStore(), TopicEmbedder()
    resolver, _ = _resolver(embedder, store, FakeMetrics())
    ctx = _context(PAGES)
    await resolver.search(ctx, "cat", 2)
    await resolver.search(ctx, "train", 2)
    assert [len(call) for call in embedder.calls] == [5, 1]  # second search: the query alone
    # A restarted proxy (new resolver, same store) embeds nothing already stored.
    restarted, _ = _resolver(embedder, store, FakeMetrics())
    await restarted.search(ctx, "wedding", 2)
    assert len(embedder.calls[-1]) == 1
    # A new page arrives: only it is embedded.
    grown = _context({**PAGES, 5: "The cat sat on the rail."})
    await restarted.search(grown, "cat", 2)
    assert embedder.calls[-1][0] == "cat" and len(embedder.calls[-1]) == 2
    assert embedder.calls[-1][1].endswith("The cat sat on the rail.")
    assert store.rows[("c1", "5", "topics")][0] == text_digest(embedder.calls[-1][1])


async def test_failing_endpoint_falls_back_to_lexical_and_retries_the_pages_later() -> None:
    store, metrics, embedder = MemoryVectorStore(), FakeMetrics(), TopicEmbedder()
    resolver, _ = _resolver(embedder, store, metrics)
    lexical_only, _ = _resolver(None, MemoryVectorStore(), FakeMetrics())
    ctx = _context(PAGES)
    embedder.failing = True
    hits = await resolver.search(ctx, "train", 3)
    assert hits == await lexical_only.search(ctx, "train", 3)
    assert metrics.count("timeout") == 1
    assert store.rows == {}
    embedder.failing = False
    await resolver.search(ctx, "cat", 3)
    assert len(embedder.calls[-1]) == 1 + len(PAGES)  # the pages that missed their turn
    assert len(store.rows) == len(PAGES)


async def test_failing_store_falls_back_to_lexical() -> None:
    store, metrics = MemoryVectorStore(), FakeMetrics()
    resolver, _ = _resolver(TopicEmbedder(), store, metrics)
    store.broken = True
    hits = await resolver.search(_context(PAGES), "train", 2)
    assert [label for label, _ in hits] == ["1", "4"] or [label for label, _ in hits] == ["4", "1"]
    assert metrics.count("store") == 1


async def test_no_embeddings_configured_is_lexical_and_counted() -> None:
    metrics = FakeMetrics()
    resolver, _ = _resolver(None, MemoryVectorStore(), metrics)
    hits = await resolver.search(_context(PAGES), "train", 2)
    assert {label for label, _ in hits} == {"1", "4"}
    assert metrics.count("not_configured") == 1
    await resolver.search(_context(PAGES), "train", 2, use_vectors=False)
    assert metrics.count("not_configured") == 1  # asked for lexical: no fallback


async def test_lexical_only_call_keeps_new_pages_for_the_next_fused_search() -> None:
    store, embedder = MemoryVectorStore(), TopicEmbedder()
    resolver, _ = _resolver(embedder, store, FakeMetrics())
    ctx = _context(PAGES)
    await resolver.search(ctx, "train", 2, use_vectors=False)
    assert embedder.calls == []
    hits = await resolver.search(ctx, "kitten", 2)
    assert len(embedder.calls[0]) == 1 + len(PAGES)
    assert hits[0][0] == "3"


async def test_a_backlog_beyond_the_inline_share_is_embedded_in_the_background() -> None:
    store, embedder = MemoryVectorStore(), TopicEmbedder()
    resolver, vectors = _resolver(embedder, store, FakeMetrics(), inline_pages=1)
    many = {n: f"page {n} about the train" if n % 2 else f"page {n} about a kitten" for n in range(1, 12)}
    await resolver.search(_context(many), "kitten", 3)
    assert len(embedder.calls[0]) == 2  # the query and one page inline
    await vectors.drain()
    assert len(store.rows) == len(many)
    hits = await resolver.search(_context(many), "cat", 3)
    assert all(int(label) % 2 == 0 for label, _ in hits)


async def test_vector_hits_of_pages_not_in_this_state_are_ignored() -> None:
    store, embedder = MemoryVectorStore(), TopicEmbedder()
    resolver, _ = _resolver(embedder, store, FakeMetrics())
    await resolver.search(_context(PAGES), "cat", 3)
    smaller = {1: PAGES[1], 2: PAGES[2]}  # e.g. another state of the conversation
    fresh, _ = _resolver(embedder, store, FakeMetrics())
    hits = await fresh.search(_context(smaller), "kitten", 5)
    assert {label for label, _ in hits} <= {"1", "2"}


@pytest.mark.parametrize("vector_weight", [0.0, 3.0])
async def test_weights_steer_the_fusion(vector_weight: float) -> None:
    resolver, _ = _resolver(
        TopicEmbedder(), MemoryVectorStore(), FakeMetrics(), vector_weight=vector_weight, min_cosine=0.5
    )
    hits = await resolver.search(_context(PAGES), "quarterly report cat", 4)
    # Lexical ranks page 4 alone (its words); the vector ranking keeps page 3 alone (the topic 'cat', the
    # others fall under min_cosine). The top lexical hit stays first (the fusion's anchor); the weight decides
    # whether the vectors' page comes right after it.
    labels = [label for label, _ in hits]
    assert labels[0] == "4"
    if vector_weight:
        assert labels[1] == "3"
