"""Recall's fault cases at unit level: empty and image-only pages (a zero vector, counted 'empty', never ranked), a
page longer than the model's input (chunks spread over all of it; its vector is their mean, so its end is found),
and a model whose forward pass fails mid-run (the search goes lexical, counted; pages stay pending, embedded
once the model works again)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from memci_proxy.engine import EstimateCounter
from memci_proxy.engine.state import ARCHIVED, ConversationState, PageRecord
from memci_proxy.recall.vectors.local_embedder import chunk_text
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.vectors.index import PageVectors
from tests.unit.recall.search.test_embeddings_fusion import FakeMetrics, MemoryVectorStore
from tests.unit.recall.vectors.test_local_embedder import FakeModel, Metrics, _embedder

IMAGE = {"type": "image_url", "image_url": {"url": "memci-blob://sha256/" + "ab" * 32 + "?type=image/png&size=2048"}}
FILLER = " ".join(f"weather{i % 50} news{i % 37} chat{i % 11}." for i in range(3000))  # about 70,000 characters
LONG_PAGE = FILLER + " In the end we adopted a kitten named Miso."


def _context(contents: dict[int, Any]) -> RecallContext:
    messages = [{"role": "user", "content": content} for content in contents.values()]
    records = [PageRecord(number=n, part=1, start=i, end=i + 1, tokens=20, status=ARCHIVED)
               for i, n in enumerate(contents)]
    return RecallContext("t1", "c1", ConversationState(pages=records), messages)


async def _fused(model: FakeModel | None = None, **kw: Any) -> tuple[RecallResolver, PageVectors, FakeModel, Metrics]:
    metrics = Metrics()
    embedder, model = _embedder(model, metrics=metrics, **kw)
    embedder._model()
    vectors = PageVectors(MemoryVectorStore(), embedder, inline_pages=0)
    return RecallResolver(None, EstimateCounter(), 2048, vectors=vectors, metrics=metrics), vectors, model, metrics


def test_a_text_of_too_many_chunks_keeps_chunks_spread_over_it() -> None:
    text = " ".join(f"word{i}" for i in range(400))
    chunks = chunk_text(text, max_chars=100, max_chunks=5)
    every = chunk_text(text, max_chars=100, max_chunks=1000)
    assert len(chunks) == 5 and chunks[0] == every[0] and chunks[-1] == every[-1]
    assert chunks == [every[round(i * (len(every) - 1) / 4)] for i in range(5)]


async def test_empty_and_image_only_pages_get_a_zero_vector_and_never_rank() -> None:
    resolver, vectors, model, metrics = await _fused()
    ctx = _context({1: "We booked the train to Lyon.", 2: "", 3: [IMAGE], 4: [{"type": "text", "text": "  "}, IMAGE],
                    5: "Our kitten Miso hides under the sofa."})
    await resolver.prepare(ctx)
    await vectors.drain()
    assert metrics.embedded("empty") == 3 and metrics.embedded("embedded") == 2
    assert all(len(batch) == 2 for batch in model.inputs)  # only the two pages that say something reach the model
    nearest = dict(await vectors.nearest("t1", "c1", "user image empty placeholder", 5))
    assert nearest["2"] == nearest["3"] == nearest["4"] == 0.0
    hits = await resolver.search(ctx, "kitten", 5)
    assert [label for label, _ in hits] == ["5"]
    outcome = await resolver.resolve(ctx, type("Args", (), {"pages": ["3"], "query": "", "problems": []})())
    assert "[image memci-blob://sha256/" in outcome.text and "no description available" in outcome.text
    await vectors.close()


async def test_a_described_image_is_embedded_like_text() -> None:
    resolver, vectors, model, metrics = await _fused()
    ctx = _context({1: [IMAGE]})
    ctx.image_descriptions = {"ab" * 32: "a kitten asleep on a sofa"}
    await resolver.prepare(ctx)
    await vectors.drain()
    assert metrics.embedded("embedded") == 1 and "kitten" in model.inputs[0][0]
    await vectors.close()


async def test_a_page_longer_than_the_model_input_is_the_mean_of_its_chunks_and_its_end_is_found() -> None:
    resolver, vectors, model, metrics = await _fused()
    ctx = _context({1: "We booked the train to Lyon.", 2: "The quarterly report is due on Friday.", 3: LONG_PAGE})
    await resolver.prepare(ctx)
    await vectors.drain()
    assert metrics.embedded("chunked") == 1
    text = vectors.store.rows[("c1", "3", "use-multilingual-v3")]
    chunks = chunk_text("user: " + LONG_PAGE)
    assert len(chunks) == 24 and "Miso" in chunks[-1]
    mean = np.asarray(FakeModel()(chunks)).mean(axis=0)
    assert np.allclose(text[1], mean / np.linalg.norm(mean), atol=1e-6)
    ((label, cosine),) = await vectors.nearest("t1", "c1", "kitten Miso", 1)
    assert label == "3" and cosine > 0
    assert [label for label, _ in await resolver.search(ctx, "kitten Miso", 3)][0] == "3"
    await vectors.close()


async def test_a_model_failing_mid_run_goes_lexical_keeps_pages_pending_and_recovers() -> None:
    resolver, vectors, model, metrics = await _fused()
    lexical = RecallResolver(None, EstimateCounter(), 2048, metrics=FakeMetrics())
    ctx = _context({1: "We booked the train to Lyon.", 2: "Our kitten Miso hides under the sofa."})
    await resolver.prepare(ctx)
    await vectors.drain()
    ctx = _context({1: "We booked the train to Lyon.", 2: "Our kitten Miso hides under the sofa.",
                    3: "The rail strike delayed the train."})
    model.broken = True  # the forward pass raises from now on
    await resolver.prepare(ctx)
    await vectors.drain()
    assert metrics.embedded("failed") == 1 and len(vectors.store.rows) == 2  # page 3 still pending
    assert vectors.backlog.pages() == 1
    hits = await resolver.search(ctx, "train", 3)
    assert hits == await lexical.search(ctx, "train", 3) and {label for label, _ in hits} == {"1", "3"}
    assert metrics.count("model_error") == 1
    model.broken = False
    await resolver.search(ctx, "train", 3)  # the query embeds again; the pending page is retried in the background
    await vectors.drain()
    assert len(vectors.store.rows) == 3 and vectors.backlog.pages() == 0
    assert metrics.count("model_error") == 1
    assert math.isclose(float(np.linalg.norm(vectors.store.rows[("c1", "3", "use-multilingual-v3")][1])), 1.0,
                        rel_tol=1e-5)
    await vectors.close()
