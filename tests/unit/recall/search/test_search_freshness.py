"""A search does not re-check every page when nothing changed, yet sees every change: a page record replaced in
place is indexed again, and vectors stored after the last search are in the in-process scan."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from memci_proxy.engine import EstimateCounter
from memci_proxy.engine.state import ARCHIVED, PageRecord, common_prefix_of_records
from memci_proxy.recall.resolver import RecallResolver
from memci_proxy.recall.vectors.index import PageVectors
from tests.unit.recall.search.test_embeddings_fusion import PAGES, MemoryVectorStore, TopicEmbedder, _context


class CountingSource:
    """The messages of ctx, counting the pages read."""

    def __init__(self) -> None:
        self.reads = 0

    async def messages(self, ctx: Any, start: int, end: int) -> list[dict[str, Any]]:
        self.reads += 1
        return ctx.messages[start:end]


async def test_unchanged_pages_are_not_read_again_and_a_replaced_record_is_reindexed() -> None:
    resolver = RecallResolver(None, EstimateCounter(), 2048)
    source = CountingSource()
    resolver.indexes.source = source  # type: ignore[assignment]
    ctx = _context(PAGES)
    assert [label for label, _ in await resolver.search(ctx, "wedding suit", 1)] == ["2"]
    assert source.reads == len(PAGES)
    await resolver.search(ctx, "train", 1)
    assert source.reads == len(PAGES)  # nothing changed: nothing read
    # Page 2 now starts at a new message (the list is the same object, one record replaced).
    ctx.messages.append({"role": "user", "content": "The wedding moved to a castle; the suit is grey now."})
    ctx.state.pages[1] = PageRecord(number=2, part=1, start=len(ctx.messages) - 1, end=len(ctx.messages),
                                    tokens=20, status=ARCHIVED)
    hits = await resolver.search(ctx, "castle", 1)
    assert [label for label, _ in hits] == ["2"] and source.reads == len(PAGES) + 1


async def test_vectors_stored_after_a_search_are_in_the_next_scan() -> None:
    store = MemoryVectorStore()
    vectors = PageVectors(store, TopicEmbedder(), inline_pages=0)
    resolver = RecallResolver(None, EstimateCounter(), 2048, vectors=vectors)
    ctx = _context(PAGES)
    await resolver.prepare(ctx)
    await vectors.drain()
    assert "5" not in dict(await vectors.nearest("t1", "c1", "rail", 5))
    grown = _context({**PAGES, 5: "A new page about the rail strike."})
    await resolver.prepare(grown)
    await vectors.drain()

    async def no_store(*_a: Any, **_kw: Any) -> list[tuple[str, float]]:
        raise AssertionError("every vector is in this process: the store is not asked")

    store.nearest_pages = no_store  # type: ignore[method-assign]
    assert "5" in dict(await vectors.nearest("t1", "c1", "rail", 5))
    await vectors.close()


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_the_records_passed_over_are_exactly_the_unchanged_leading_ones(before: list[int], now: list[int]) -> None:
    def records(starts: list[int]) -> list[PageRecord]:
        return [PageRecord(number=i + 1, part=1, start=s, end=s + 1, tokens=5, status=ARCHIVED)
                for i, s in enumerate(starts)]

    old, new = records(before), records(now)
    naive = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    assert common_prefix_of_records(old, new) == naive


def _active_context(texts: list[str]):
    """Pages of one message each, all active, with their entries' digests (as a planned state has them)."""
    from memci_proxy.engine.state import ACTIVE, HASH_SIZE, ConversationState
    from memci_proxy.recall.search.indexes import RecallContext

    messages = [{"role": "user", "content": text} for text in texts]
    records = [PageRecord(number=i + 1, part=1, start=i, end=i + 1, tokens=20, status=ACTIVE)
               for i in range(len(texts))]
    digests = b"".join(bytes([i]) * HASH_SIZE for i in range(len(texts)))
    return RecallContext("t1", "c1", ConversationState(pages=records, hash_blob=digests), messages)


def _archive(ctx: Any, count: int) -> None:
    import msgspec

    for i in range(count):
        ctx.state.pages[i] = msgspec.structs.replace(ctx.state.pages[i], status=ARCHIVED)


async def test_pages_read_behind_an_answer_are_indexed_at_the_epoch_without_reading_them() -> None:
    resolver = RecallResolver(None, EstimateCounter(), 2048)
    source = CountingSource()
    resolver.indexes.source = source  # type: ignore[assignment]
    ctx = _active_context(list(PAGES.values()))
    assert resolver.prepare_active(ctx) == len(PAGES) - 1  # the newest page may still grow: not read
    assert resolver.prepare_active(ctx) == 0  # read once
    _archive(ctx, 3)  # the epoch
    assert [label for label, _ in await resolver.search(ctx, "wedding suit", 1)] == ["2"]
    assert source.reads == 0


async def test_a_page_whose_messages_changed_since_it_was_read_is_read_again() -> None:
    from memci_proxy.engine.state import HASH_SIZE

    resolver = RecallResolver(None, EstimateCounter(), 2048)
    source = CountingSource()
    resolver.indexes.source = source  # type: ignore[assignment]
    ctx = _active_context(list(PAGES.values()))
    resolver.prepare_active(ctx)
    # a fork: the client's second message is another one now (another digest)
    ctx.messages[1] = {"role": "user", "content": "The castle tour is on Sunday."}
    ctx.state.hash_blob = ctx.state.hash_blob[:HASH_SIZE] + b"\xff" * HASH_SIZE + ctx.state.hash_blob[2 * HASH_SIZE:]
    _archive(ctx, 3)
    assert [label for label, _ in await resolver.search(ctx, "castle", 1)] == ["2"]
    assert source.reads == 1  # that page alone


async def test_pages_with_images_are_left_to_the_epoch() -> None:
    resolver = RecallResolver(None, EstimateCounter(), 2048)
    ctx = _active_context(["a photo of the harbour", "more", "newest"])
    ctx.messages[0] = {"role": "user", "content": [{"type": "text", "text": "look"},
                                                   {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
    assert resolver.prepare_active(ctx) == 1  # the second page only: an image's description may come later
