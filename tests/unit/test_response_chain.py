"""The chain behind previous_response_id: the answer does not wait for its write, and the id is found before the
write lands (this replica waits for it; another replica looks again for a moment)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from memci_proxy.api.response_chain import ResponseChain
from memci_proxy.wire.errors import ProxyError


class SlowChains:
    """A store whose writes take ``delay`` seconds."""

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.rows: dict[tuple[str, str], tuple[str | None, list[dict[str, Any]]]] = {}
        self.writes = 0

    async def put_response(self, tenant: str, response_id: str, previous_id: str | None,
                           messages: list[dict[str, Any]], conversation_id: str | None = None) -> None:
        await asyncio.sleep(self.delay)
        self.rows[(tenant, response_id)] = (previous_id, messages)
        self.writes += 1

    async def load_links(self, tenant: str, response_id: str) -> list[tuple[str, list[dict[str, Any]]]] | None:
        links, at = [], response_id
        while at is not None and (tenant, at) in self.rows:
            previous, messages = self.rows[(tenant, at)]
            links.insert(0, (at, messages))
            at = previous
        return links or None

    async def all_present(self, tenant: str, response_ids: Any) -> bool:
        return all((tenant, i) in self.rows for i in response_ids)


HELLO = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]


async def test_keeping_an_answer_does_not_wait_for_its_write_and_a_lookup_here_waits_for_it() -> None:
    store = SlowChains(delay=0.2)
    chain = ResponseChain(store)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await chain.keep("t1", "resp_1", None, [], HELLO, "c1")
    assert loop.time() - started < 0.05 and store.writes == 0  # the answer goes out at once
    chain.cache.pop(("t1", "resp_1"))  # even out of the cache: the lookup waits for the write under way
    assert await chain.messages("t1", "resp_1") == HELLO
    assert store.writes == 1


async def test_another_replica_finds_an_id_whose_write_lands_a_moment_later() -> None:
    store = SlowChains(delay=0.1)
    here, there = ResponseChain(store), ResponseChain(store)
    await here.keep("t1", "resp_1", None, [], HELLO)
    assert await there.messages("t1", "resp_1") == HELLO  # looked again until the write landed
    with pytest.raises(ProxyError) as missing:
        await there.messages("t1", "resp_unknown")
    assert missing.value.status == 404


async def test_flush_waits_for_every_write_under_way() -> None:
    store = SlowChains(delay=0.05)
    chain = ResponseChain(store)
    for n in range(3):
        await chain.keep("t1", f"resp_{n}", f"resp_{n - 1}" if n else None, [], HELLO)
    await chain.flush()
    assert store.writes == 3 and await store.load_links("t1", "resp_2") is not None
