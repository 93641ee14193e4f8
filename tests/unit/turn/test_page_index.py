"""The pages an epoch stores before its upstream call are full-text indexed after the answer (memci_proxy.turn.page_index):
the write asks for ``index_behind``, the index follows in the background, a read that must see it waits for it."""

from __future__ import annotations

import asyncio

from memci_proxy.metrics import Metrics
from memci_proxy.store.ports import TurnWrite
from memci_proxy.turn.page_index import IndexBehind
from turn_fakes import Chat, ChatUpstream, MemoryRepository, make_service


class IndexingRepository(MemoryRepository):
    def __init__(self) -> None:
        super().__init__()
        self.behind: list[bool] = []  # index_behind of each write
        self.indexed: list[tuple[str, list[str]]] = []
        self.left = 0
        self.slow: asyncio.Event | None = None

    async def save_turns(self, writes: list[TurnWrite]) -> list[str]:
        self.behind += [w.index_behind for w in writes]
        return await super().save_turns(writes)

    async def index_pages(self, tenant: str, conversation_id: str, numbers: list[str]) -> int:
        if self.slow is not None:
            await self.slow.wait()
        self.indexed.append((conversation_id, list(numbers)))
        return len(numbers)

    async def index_left_pages(self) -> int:
        self.left += 1
        return 0


async def _until_an_epoch(service) -> Chat:
    chat = Chat(service)
    i = 0
    while chat.last_headers.get("X-Memci-Epoch") != "true" or i < 2:
        await chat.send(chat.user_text(i))
        i += 1
        assert i < 80, "no epoch"
    return chat


async def test_an_epochs_archived_pages_are_indexed_after_its_answer():
    repo = IndexingRepository()
    service = make_service(ChatUpstream(), repo, write_behind_max_lag_ms=60_000, page_fulltext=True)
    await asyncio.sleep(0)
    assert repo.left == 1  # a stopped process's leftovers, at start
    chat = await _until_an_epoch(service)
    try:
        assert repo.behind[-1]  # the epoch's write left the index behind
        await service.flush(chat.conversation_id)  # a read of the database waits for the index
        stored = repo.conversations[chat.conversation_id].pages
        archived = {n for n, p in stored.items() if p.state != "active"}
        assert archived and [c for c, _ in repo.indexed] == [chat.conversation_id]
        assert set(repo.indexed[0][1]) == archived
    finally:
        await service.close()


async def test_a_read_waits_for_the_index_and_a_failed_one_is_tried_again():
    repo = IndexingRepository()
    index = IndexBehind(repo, Metrics())
    assert index.enabled  # (enabled unless page_fulltext is off)
    index.stored("t", "c1", ["1", "2"])
    repo.slow = asyncio.Event()
    index.soon("c1")
    waiting = asyncio.ensure_future(index.wait("c1"))
    await asyncio.sleep(0.01)
    assert not waiting.done() and repo.indexed == []
    index.stored("t", "c1", ["3"])  # stored meanwhile: indexed next, the wait covers it too
    repo.slow.set()
    await waiting
    assert repo.indexed == [("c1", ["1", "2"]), ("c1", ["3"])]

    class Failing(IndexingRepository):
        down = True

        async def index_pages(self, tenant, conversation_id, numbers):
            if self.down:
                self.down = False
                raise ConnectionError("database down")
            return await super().index_pages(tenant, conversation_id, numbers)

    failing, metrics = Failing(), Metrics()
    index = IndexBehind(failing, metrics)
    index.stored("t", "c1", ["1"])
    index.soon("c1")
    await asyncio.sleep(0.01)
    assert failing.indexed == [] and metrics.store_write_failures.labels("index")._value.get() == 1
    await index.wait("c1")  # kept, and tried again
    assert failing.indexed == [("c1", ["1"])]
    await index.close()


async def test_without_page_fulltext_no_page_is_indexed_nor_any_left_over():
    repo = IndexingRepository()
    service = make_service(ChatUpstream(), repo, write_behind_max_lag_ms=60_000)  # page_fulltext off: the default
    await asyncio.sleep(0)
    assert not service.states.index.enabled and repo.left == 0  # the leftovers at start are not indexed either
    chat = await _until_an_epoch(service)
    try:
        await service.flush(chat.conversation_id)
        assert any(repo.behind) and repo.indexed == []  # the epoch's pages stored, never indexed
        assert any(p.state != "active" for p in repo.conversations[chat.conversation_id].pages.values())
    finally:
        await service.close()


async def test_without_an_index_to_make_the_write_computes_it():
    repo = MemoryRepository()  # no index_pages: nothing left behind
    service = make_service(ChatUpstream(), repo)
    assert not service.states.index.enabled
    await service.close()
