"""The default vector half (embeddings_pages=candidates): a search embeds its query alone and re-orders its lexical
candidates by the vectors that exist; pages are embedded in the background, by digest."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from memci_proxy.engine import EstimateCounter
from memci_proxy.engine.state import ARCHIVED, ConversationState, PageRecord
from memci_proxy.recall.vectors.candidates import CandidateVectors, page_sample
from memci_proxy.recall.search.fusion import cosine_similarity
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.vectors.index import PageVectors
from tests.unit.recall.search.test_embeddings_fusion import (PAGES, FakeMetrics, MemoryVectorStore, TopicEmbedder,
                                                             _context)


def _resolver(embedder: TopicEmbedder, metrics: FakeMetrics | None = None, **kw: Any) -> RecallResolver:
    vectors = CandidateVectors(embedder, **kw)
    return RecallResolver(None, EstimateCounter(), 2048, vectors=vectors, metrics=metrics or FakeMetrics())


def _embedded_pages(embedder: TopicEmbedder) -> list[str]:
    """Page texts given to the model (queries are one short line each)."""
    return [t for call in embedder.calls for t in call if t.startswith("user:")]


async def _search(resolver: RecallResolver, ctx: RecallContext, query: str, k: int) -> list[tuple[str, float]]:
    """A search, then the background embedding it queued."""
    hits = await resolver.search(ctx, query, k)
    await resolver.vectors.drain()  # type: ignore[union-attr]
    return hits


async def test_a_search_embeds_its_query_alone_and_queues_its_candidates_for_the_background() -> None:
    embedder = TopicEmbedder()
    resolver = _resolver(embedder)
    ctx = _context(PAGES)
    hits = await resolver.search(ctx, "train delays report", 3)
    assert {label for label, _ in hits} == {"1", "4"}  # the pages that hold a query word
    assert _embedded_pages(embedder) == [] and len(embedder.calls) == 1  # the query alone on the request path
    await resolver.vectors.drain()  # type: ignore[union-attr]
    assert sorted(_embedded_pages(embedder)) == sorted(f"user: {PAGES[n]}" for n in (1, 4))  # in the background
    embedder.calls.clear()
    await _search(resolver, ctx, "the train to Lyon", 3)
    assert _embedded_pages(embedder) == []  # known by digest: the query alone is embedded
    assert len(embedder.calls) == 1


async def test_pages_archived_by_a_turn_are_embedded_after_it_in_the_background() -> None:
    embedder = TopicEmbedder()
    resolver = _resolver(embedder)
    ctx = _context(PAGES)
    assert resolver.embeds_archived_pages
    await resolver.prepare(ctx)  # after the turn that archived them
    await resolver.vectors.drain()  # type: ignore[union-attr]
    assert sorted(_embedded_pages(embedder)) == sorted(f"user: {text}" for text in PAGES.values())
    embedder.calls.clear()
    await resolver.search(ctx, "train delays report", 3)
    assert len(embedder.calls) == 1 and _embedded_pages(embedder) == []


async def test_the_query_has_a_deadline_past_which_the_search_is_lexical() -> None:
    class SlowQueries(TopicEmbedder):
        async def embed_query(self, text: str) -> list[float] | None:
            await asyncio.sleep(0.2)
            return (await self.embed([text]) or [None])[0]

    metrics = FakeMetrics()
    resolver = _resolver(SlowQueries(), metrics, query_deadline_s=0.01)
    lexical = RecallResolver(None, EstimateCounter(), 2048, metrics=FakeMetrics())
    ctx = _context(PAGES)
    assert await resolver.search(ctx, "train report", 3) == await lexical.search(ctx, "train report", 3)
    assert metrics.count("deadline") == 1


async def test_vectors_reorder_the_candidates_below_the_top_lexical_hits() -> None:
    pages = {1: "train report train report", 2: "report about my kitten and what it did all day in the old garden shed",
             3: "report on the budget", 4: "a cat",
             5: "report of the train delays", 6: "budget report, second draft", 7: "the weather was fine",
             8: "lunch with the team", 9: "a walk in the park", 10: "the new office chairs"}
    resolver = _resolver(TopicEmbedder())
    lexical = RecallResolver(None, EstimateCounter(), 2048, metrics=FakeMetrics())
    ctx = _context(pages)
    plain = [label for label, _ in await lexical.search(ctx, "report cat", 6)]
    assert [label for label, _ in await _search(resolver, ctx, "report cat", 6)] == plain  # no vectors yet
    fused = [label for label, _ in await resolver.search(ctx, "report cat", 6)]
    assert fused[:2] == plain[:2]  # the anchor
    assert set(fused) == set(plain)  # only what BM25 found
    if "2" not in plain[:2]:
        assert fused.index("2") < plain.index("2")  # the kitten page climbs: its vector is the query's topic


async def test_a_changed_page_is_embedded_again() -> None:
    embedder = TopicEmbedder()
    resolver = _resolver(embedder)
    await _search(resolver, _context(PAGES), "train", 2)
    changed = dict(PAGES)
    changed[1] = "We booked the train to Paris instead."
    other = _resolver(embedder)
    other.vectors._by_digest = resolver.vectors._by_digest  # type: ignore[union-attr]  # one process's cache
    embedder.calls.clear()
    await _search(other, _context(changed), "train", 2)
    assert _embedded_pages(embedder) == [f"user: {changed[1]}"]


async def test_the_text_a_search_queues_is_bounded() -> None:
    embedder = TopicEmbedder()
    pages = {n: f"{'report' if n <= 8 else 'memo'} number {n} " + "word " * 200 for n in range(1, 17)}
    resolver = _resolver(embedder, page_chars=500, search_chars=1200)
    hits = await _search(resolver, _context(pages), "report", 5)
    embedded = _embedded_pages(embedder)
    assert len(embedded) == 3 and all(len(t) <= 500 for t in embedded)  # 500 + 500 + 500 >= 1200: three pages
    assert len(hits) == 5  # the others keep their lexical rank


async def test_a_failing_model_leaves_the_search_lexical_and_counted() -> None:
    embedder, metrics = TopicEmbedder(), FakeMetrics()
    embedder.failing = True
    resolver = _resolver(embedder, metrics)
    lexical = RecallResolver(None, EstimateCounter(), 2048, metrics=FakeMetrics())
    ctx = _context(PAGES)
    assert await resolver.search(ctx, "train report", 3) == await lexical.search(ctx, "train report", 3)
    assert metrics.count("timeout") == 1


async def test_both_modes_embed_pages_after_the_turn() -> None:
    assert _resolver(TopicEmbedder()).embeds_archived_pages
    archive = RecallResolver(None, EstimateCounter(), 2048, vectors=PageVectors(MemoryVectorStore(), TopicEmbedder()))
    assert archive.embeds_archived_pages
    assert not RecallResolver(None, EstimateCounter(), 2048).embeds_archived_pages


def test_page_sample_keeps_short_texts_and_spreads_long_ones() -> None:
    assert page_sample("short text", 100) == "short text"
    text = " ".join(f"w{i:04d}" for i in range(2000))
    sample = page_sample(text, 1200, piece=300)
    assert len(sample) <= 1200 + 3
    assert sample.startswith("w0000") and sample.rstrip().endswith("w1999")


async def test_the_user_words_of_the_candidates_are_embedded_first_and_their_best_view_counts() -> None:
    embedder = TopicEmbedder()
    resolver = _resolver(embedder)
    exchanges = [("Our kitten Miso hides under the sofa.", "Trains to Lyon: the rail timetable, " * 20),
                 ("The sofa came today.", "Enjoy the new sofa."),
                 ("Which sofa fits a small room?", "A two-seat sofa; the train of thought: " + "rail " * 30),
                 *((f"Lunch plan {n}", "Soup.") for n in range(6))]
    messages = [{"role": role, "content": text}
                for pair in exchanges for role, text in zip(("user", "assistant"), pair)]
    records = [PageRecord(number=n + 1, part=1, start=2 * n, end=2 * n + 2, tokens=20, status=ARCHIVED)
               for n in range(len(exchanges))]
    ctx = RecallContext("t1", "c1", ConversationState(pages=records), messages)
    hits = await _search(resolver, ctx, "kitten sofa", 3)
    assert {label for label, _ in hits} == {"1", "2", "3"}
    embedded = [t for call in embedder.calls for t in call if t.startswith("user:")]
    users = [t for t in embedded if "assistant:" not in t]
    assert len(users) == 3 and embedded[:3] == users  # every candidate's user words, then the whole pages
    assert len(embedded) == 6  # no other page holds a query word
    cosines = dict(await resolver._candidate_cosines(ctx, "kitten sofa", hits))
    query, user_view, page_view = await embedder.embed(["kitten sofa", f"user: {exchanges[0][0]}",
                                                        f"user: {exchanges[0][0]}\nassistant: {exchanges[0][1]}"])
    assert cosines["1"] == pytest.approx(cosine_similarity(user_view, query))  # its best view: the user's words
    assert cosine_similarity(page_view, query) < 0.5 < cosines["1"]  # the whole page is about trains
    assert cosines["1"] > cosines["3"]


async def test_an_archived_page_gets_its_user_words_embedded_and_a_long_pages_whole_text_never() -> None:
    """A short page's whole text (one input of the model) and a page without user words are embedded whole when
    archived; a long page's whole text is not embedded, neither then nor when a search finds the page (a page's
    search ranks by its user words: the same recall@5 on every evaluation set, docs/memory.md)."""
    embedder = TopicEmbedder()
    resolver = _resolver(embedder)
    exchanges = [("Our kitten Miso hides under the sofa.", "Trains to Lyon: the rail timetable, " * 40),
                 ("Lunch plan for Friday?", "Soup and bread."),
                 ("Tell me about rail passes.", "A rail pass covers " + "trains " * 200)]
    messages = [{"role": role, "content": text}
                for pair in exchanges for role, text in zip(("user", "assistant"), pair)]
    messages.append({"role": "assistant", "content": "A page of the assistant's words alone."})
    records = [PageRecord(number=n + 1, part=1, start=2 * n, end=2 * n + 2, tokens=20, status=ARCHIVED)
               for n in range(len(exchanges))]
    records.append(PageRecord(number=4, part=1, start=6, end=7, tokens=10, status=ARCHIVED))
    ctx = RecallContext("t1", "c1", ConversationState(pages=records), messages)
    await resolver.prepare(ctx)  # after the turn that archived them
    await resolver.vectors.drain()  # type: ignore[union-attr]
    embedded = [t for call in embedder.calls for t in call]
    assert sorted(embedded) == sorted([*(f"user: {user}" for user, _ in exchanges),
                                       "user: Lunch plan for Friday?\nassistant: Soup and bread.",
                                       "assistant: A page of the assistant's words alone."])
    embedder.calls.clear()
    hits = await _search(resolver, ctx, "kitten sofa", 3)  # finds page 1: nothing more is embedded behind it
    assert hits[0][0] == "1" and embedder.calls == [["kitten sofa"]]
    read: list[int] = []
    messages_of = resolver.source.messages

    async def counted(ctx: RecallContext, start: int, end: int) -> list[dict[str, Any]]:
        read.append(start)
        return await messages_of(ctx, start, end)

    resolver.source.messages = counted  # type: ignore[method-assign]
    embedder.calls.clear()
    await _search(resolver, ctx, "kitten sofa", 3)
    assert embedder.calls == [["kitten sofa"]] and read == []  # the whole text, turned down once, is not read again


async def test_after_a_restart_a_search_queues_the_views_its_candidates_lack() -> None:
    """Vectors are not stored: a process that starts without them embeds a candidate's wanted views once a search
    finds it (its user words; a short page's whole text), the long page's whole text still not."""
    exchanges = [("Our kitten Miso hides under the sofa.", "Trains to Lyon: the rail timetable, " * 40),
                 ("Which sofa for the kitten?", "A small one.")]
    messages = [{"role": role, "content": text}
                for pair in exchanges for role, text in zip(("user", "assistant"), pair)]
    records = [PageRecord(number=n + 1, part=1, start=2 * n, end=2 * n + 2, tokens=20, status=ARCHIVED)
               for n in range(len(exchanges))]
    ctx = RecallContext("t1", "c1", ConversationState(pages=records), messages)
    embedder = TopicEmbedder()
    await _search(_resolver(embedder), ctx, "kitten sofa", 2)  # a new process: no page embedded before
    embedded = [t for call in embedder.calls[1:] for t in call]
    assert sorted(embedded) == sorted([f"user: {exchanges[0][0]}", f"user: {exchanges[1][0]}",
                                       f"user: {exchanges[1][0]}\nassistant: {exchanges[1][1]}"])


def test_an_embeddings_servers_query_is_bounded_by_its_timeout_the_packaged_models_by_the_deadline() -> None:
    from memci_proxy.recall.vectors.build import build_page_vectors

    served = build_page_vectors(None, "http://127.0.0.1:9/v1", timeout_s=5.0, query_deadline_s=0.05)  # type: ignore[arg-type]
    assert served.query_deadline_s == 5.0
    local = build_page_vectors(None, "", local_model="use-multilingual-v3", query_deadline_s=0.05)  # type: ignore[arg-type]
    assert local.query_deadline_s == 0.05
