"""The embedded PostgreSQL and open_store's choice of adapters."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from memci_proxy.settings import load_settings
from memci_proxy.store.factory import open_store
from memci_proxy.store.hot.memory import InProcessHotState
from memci_proxy.store.hot.resilient import ResilientHotState
from memci_proxy.store.sql.migrate import current_revision, head_revision
from memci_proxy.store.sql.repository import SqlConversationRepository


@pytest.fixture
def home(pg_home: Path) -> Path:
    return pg_home


async def test_open_store_without_urls_starts_embedded_postgres_and_in_process_state(home: Path) -> None:
    settings = load_settings(env={}, overrides={"home": str(home), "database_url": "", "redis_url": ""})
    store = await open_store(settings)
    try:
        assert (store.kind_db, store.kind_hot) == ("embedded", "in-process")
        assert isinstance(store.repo, SqlConversationRepository)
        assert isinstance(store.hot, InProcessHotState)
        assert store.embedded is not None and store.embedded.data_dir == (home / "pg").resolve()
        assert store.database_url.startswith("postgresql+asyncpg://")
        assert current_revision(store.database_url) == head_revision()
        assert await store.repo.ping()

        # Starting again on the same directory joins the running server.
        from memci_proxy.store.sql.embedded import start_embedded_postgres

        again = start_embedded_postgres(home / "pg")
        assert again.server_uri == store.embedded.server_uri
        with psycopg.connect(again.libpq_url) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("memci",)
    finally:
        await store.close()


async def test_open_store_with_urls_uses_them(migrated_db_url: str, redis_url: str, home: Path) -> None:
    settings = load_settings(
        env={}, overrides={"home": str(home), "database_url": migrated_db_url, "redis_url": redis_url}
    )
    store = await open_store(settings)
    try:
        assert (store.kind_db, store.kind_hot) == ("external", "redis")
        assert store.embedded is None
        assert isinstance(store.hot, ResilientHotState)
        assert await store.repo.ping() and await store.hot.ping()
        assert not (home / "pg").exists()
    finally:
        await store.close()


@pytest.mark.skipif(bool(os.environ.get("DATABASE_URL")), reason="embedded server only")
def test_postgres_fixture_has_pgvector(migrated_db_url: str) -> None:
    from memci_proxy.store.sql.urls import to_libpq_url

    with psycopg.connect(to_libpq_url(migrated_db_url)) as conn:
        assert conn.execute("SELECT '[1,2,3]'::vector <-> '[1,2,4]'::vector").fetchone() == (1.0,)


def test_workers_creating_one_database_at_once_all_succeed_and_one_creates_it(postgres_server) -> None:
    """Server workers starting together each create the embedded database when missing: they race (PostgreSQL
    answers the loser with DuplicateDatabase or, when both insert into pg_database at once, with the catalog's
    UniqueViolation), and each must go on with the database the winner made."""
    import threading

    from memci_proxy.store.sql.embedded import create_database_if_missing

    name = f"memci_race_{os.getpid()}"
    barrier = threading.Barrier(6)
    created: list[bool] = []
    errors: list[BaseException] = []

    def create() -> None:
        barrier.wait()
        try:
            created.append(create_database_if_missing(postgres_server.admin_url, name))
        except BaseException as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    for _ in range(3):
        threads = [threading.Thread(target=create) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert created.count(True) == 1 and len(created) == 6
        postgres_server.drop_database(name)
        created.clear()
