"""Responses' answer chains on a real PostgreSQL: stored before the answer, read back whole from any id, walled by
tenant, and the proxy's cache of them answers from the store after a restart."""

from __future__ import annotations

import pytest

from proxy.api.response_chain import ResponseChain
from proxy.store.ports import ResponseChains
from proxy.store.sql.response_chains import SqlResponseChains
from proxy.wire.errors import ProxyError


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
