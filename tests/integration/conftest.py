"""Fixtures of the storage adapters over the real services of tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from memci_proxy.store.hot.memory import InProcessHotState
from memci_proxy.store.hot.redis import RedisHotState
from memci_proxy.store.ports import HotState
from memci_proxy.store.sql.repository import SqlConversationRepository, create_engine_from_url


@pytest.fixture
async def repo(migrated_db_url: str) -> AsyncIterator[SqlConversationRepository]:
    """A repository on a fresh migrated database."""
    engine = create_engine_from_url(migrated_db_url, pool_size=2, max_overflow=2)
    try:
        yield SqlConversationRepository(engine)
    finally:
        await engine.dispose()


@pytest.fixture(params=["in-process", "redis"])
async def hot_state(request: pytest.FixtureRequest) -> AsyncIterator[HotState]:
    """Each HotState adapter in turn (the Redis one on a flushed database)."""
    state: HotState
    if request.param == "redis":
        state = RedisHotState(request.getfixturevalue("redis_url"))
    else:
        state = InProcessHotState()
    try:
        yield state
    finally:
        await state.close()
