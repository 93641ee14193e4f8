"""The reads on the driver's connection go on connections that are not pinged before each use: a connection the
server closed is replaced when taken from the pool, and a read on one whose loss went unseen is tried once more."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from memci_proxy.store.sql.repository import SqlConversationRepository, create_engine_from_url


@pytest.fixture
async def unpinged(migrated_db_url: str) -> AsyncIterator[SqlConversationRepository]:
    engine = create_engine_from_url(migrated_db_url, pool_size=2, max_overflow=0)
    reads = create_engine_from_url(migrated_db_url, pool_size=2, max_overflow=0, pre_ping=False)
    try:
        yield SqlConversationRepository(engine, read_engine=reads)
    finally:
        await reads.dispose()
        await engine.dispose()


async def _terminate_reads(repo: SqlConversationRepository) -> int:
    """The server drops the read pool's connections (as a restart does); how many it dropped."""
    async def pid() -> int:
        return await repo._read_on_driver(lambda raw: raw.fetchval("SELECT pg_backend_pid()"))

    pids = set(await asyncio.gather(pid(), pid()))  # both pooled connections in use at once: each one's backend
    async with repo.engine.connect() as admin:  # another pool's connection
        raw = (await admin.get_raw_connection()).driver_connection
        return sum([bool(await raw.fetchval("SELECT pg_terminate_backend($1)", p)) for p in pids])


async def test_reads_go_on_after_the_server_dropped_their_connections(migrated_db_url: str,
                                                                     unpinged: SqlConversationRepository) -> None:
    await unpinged.create_conversation("t", "c1")
    assert await unpinged.load_pages("t", "c1") == []
    assert await _terminate_reads(unpinged) == 2
    await asyncio.sleep(0.2)  # the driver sees the end of each connection's stream
    for _ in range(2):  # each pooled connection replaced when taken, without a read that fails first
        assert await unpinged._on_driver(lambda raw: raw.fetchval("SELECT 1"), unpinged.read_engine) == 1
    assert await unpinged.load_pages("t", "c1") == []
    assert await unpinged.load_entries("t", "c1", 0, 10) == []


async def test_a_read_on_a_connection_lost_unseen_is_tried_again(migrated_db_url: str,
                                                                  unpinged: SqlConversationRepository) -> None:
    await unpinged.create_conversation("t", "c1")
    calls: list[int] = []

    async def read(raw: asyncpg.Connection) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")
        return await raw.fetchval("SELECT 1")

    assert await unpinged._read_on_driver(read) == 1 and len(calls) == 2
    calls.clear()

    async def broken(raw: asyncpg.Connection) -> int:
        calls.append(1)
        raise asyncpg.exceptions.UndefinedTableError("no such table")  # not a lost connection: not tried again

    with pytest.raises(asyncpg.exceptions.UndefinedTableError):
        await unpinged._read_on_driver(broken)
    assert len(calls) == 1
