"""A pooled connection is pinged at checkout only after idling in the pool; a dead one is replaced before use."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from memci_proxy.store.sql import pool_ping
from memci_proxy.store.sql.repository import create_engine_from_url


@pytest.fixture
async def engine(migrated_db_url: str):
    engine = create_engine_from_url(migrated_db_url, pool_size=1, max_overflow=0)
    try:
        yield engine
    finally:
        await engine.dispose()


def _count_pings(engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pings: list[int] = []
    do_ping = engine.sync_engine.dialect.do_ping

    def counted(dbapi_connection):
        pings.append(1)
        return do_ping(dbapi_connection)

    monkeypatch.setattr(engine.sync_engine.dialect, "do_ping", counted)
    return pings


async def _backend_pid(engine) -> int:
    async with engine.connect() as connection:
        return (await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one()


async def test_a_connection_back_in_the_pool_moments_ago_is_not_pinged(engine, monkeypatch) -> None:
    pings = _count_pings(engine, monkeypatch)
    first = await _backend_pid(engine)  # a new connection: not pinged either
    for _ in range(5):
        assert await _backend_pid(engine) == first  # the one pooled connection, reused
    assert pings == []


async def test_an_idle_connection_is_pinged_and_a_dead_one_replaced_before_use(engine, monkeypatch, migrated_db_url
                                                                              ) -> None:
    monkeypatch.setattr(pool_ping, "PING_AFTER_IDLE_S", 0.0)
    idle = create_engine_from_url(migrated_db_url, pool_size=1, max_overflow=0)
    try:
        pings = _count_pings(idle, monkeypatch)
        first = await _backend_pid(idle)
        assert await _backend_pid(idle) == first and len(pings) == 1  # idle past the (zero) delay: pinged, alive
        async with engine.connect() as other:  # the server ends the pooled connection's session
            await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
        replaced = await _backend_pid(idle)  # the ping fails: a new connection serves the query, no error
        assert replaced != first and len(pings) == 2
    finally:
        await idle.dispose()
