"""Responses' answer chains on a real PostgreSQL: stored before the answer, read back whole from any id, walled by
tenant, and the proxy's cache of them answers from the store after a restart."""

from __future__ import annotations

import pytest

from memci_proxy.api.response_chain import ResponseChain
from memci_proxy.store.ports import ResponseChains
from memci_proxy.store.sql.response_chains import SqlResponseChains
from memci_proxy.wire.errors import ProxyError


def _turn(n: int) -> list[dict]:
    return [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": f"a{n}"}]


async def test_a_chain_is_read_back_whole_and_walled_by_tenant(repo):
    chains = SqlResponseChains(repo.engine)
    assert isinstance(chains, ResponseChains)
    await chains.put_response("t1", "resp_1", None, _turn(1))
    await chains.put_response("t1", "resp_2", "resp_1", _turn(2))
    await chains.put_response("t1", "resp_3", "resp_2", _turn(3))
    await chains.put_response("t1", "resp_2b", "resp_1", _turn(9))  # a branch from the first answer
    assert await chains.load_chain("t1", "resp_3") == _turn(1) + _turn(2) + _turn(3)
    assert await chains.load_chain("t1", "resp_2b") == _turn(1) + _turn(9)
    assert await chains.load_chain("t2", "resp_3") is None
    await chains.put_response("t2", "resp_x", "resp_2", _turn(5))  # another tenant's id ends the walk
    assert await chains.load_chain("t2", "resp_x") == _turn(5)


async def test_a_new_process_reads_the_chain_from_the_store(repo):
    before = ResponseChain(SqlResponseChains(repo.engine))
    await before.keep("t1", "resp_a", None, [], _turn(1))
    await before.keep("t1", "resp_b", "resp_a", _turn(1), _turn(2))
    after = ResponseChain(SqlResponseChains(repo.engine))  # nothing cached: a restart, another replica
    assert await after.messages("t1", "resp_b") == _turn(1) + _turn(2)
    with pytest.raises(ProxyError) as missing:
        await after.messages("t1", "resp_none")
    assert missing.value.status == 404 and missing.value.param == "previous_response_id"


async def test_erasing_a_conversation_erases_its_answers_on_every_replica(repo):
    """The answers of a deleted conversation are gone from the table, from the erasing replica's cache, and another
    replica's cached chain is not used any more; another conversation's answers stay."""
    from memci_proxy.store.sql.blob_queries import SqlBlobOwnership

    await repo.create_conversation("t1", "conv_a")
    await repo.create_conversation("t1", "conv_b")
    erasing = ResponseChain(SqlResponseChains(repo.engine))
    other = ResponseChain(SqlResponseChains(repo.engine))  # another replica
    await erasing.keep("t1", "resp_a1", None, [], _turn(1), "conv_a")
    await erasing.keep("t1", "resp_a2", "resp_a1", _turn(1), _turn(2), "conv_a")
    await erasing.keep("t1", "resp_b1", None, [], _turn(7), "conv_b")
    assert await other.messages("t1", "resp_a2") == _turn(1) + _turn(2)  # now cached there too

    erased = await SqlBlobOwnership(repo.engine).erase_conversation("t1", "conv_a")
    assert sorted(erased.response_ids) == ["resp_a1", "resp_a2"]
    erasing.forget("t1", erased.response_ids)
    assert ("t1", "resp_a2") not in erasing.cache and ("t1", "resp_a1") not in erasing.cache
    async with repo.engine.connect() as connection:
        left = (await connection.exec_driver_sql("SELECT id FROM response_chains ORDER BY id")).scalars().all()
        events = (await connection.exec_driver_sql(
            "SELECT count(*) FROM events WHERE payload->>'id' LIKE 'resp_a%'")).scalar()
    assert left == ["resp_b1"] and events == 0
    for replica in (erasing, other):
        for gone in ("resp_a1", "resp_a2"):
            with pytest.raises(ProxyError) as missing:
                await replica.messages("t1", gone)
            assert missing.value.status == 404
        assert await replica.messages("t1", "resp_b1") == _turn(7)
    assert ("t1", "resp_a2") not in other.cache


async def test_the_cache_is_bounded_in_bytes():
    chain = ResponseChain(None, cached=512, cached_bytes=10 << 20)
    big = "x" * (4 << 20)
    previous = None
    for n in range(40):
        response_id = f"resp_{n}"
        history = await chain.messages("t1", previous) if previous and n % 2 else []
        await chain.keep("t1", response_id, previous if history else None, history,
                         [{"role": "user", "content": big}, {"role": "assistant", "content": "ok"}])
        previous = response_id
        assert chain.cache.bytes <= 10 << 20
    assert len(chain.cache) >= 1 and chain.cache.cache_stats().max_bytes == 10 << 20
