"""Shared fixtures: real PostgreSQL (with pgvector) and real Redis.

- DATABASE_URL set: that server is used (the role needs CREATEDB); else an embedded PostgreSQL
  (pgserver) is started once per test session in a temporary directory.
- REDIS_URL set: that Redis is used (its database is FLUSHed before each test that asks for
  ``redis_url``); else ``redis-server`` is started once per session on a free loopback port, and
  the tests that need it are skipped when it is not installed.

Fixtures:
  postgres_server    (session) PostgresServer: url(database, driver), create_database, drop_database
  postgres_url       (session) asyncpg SQLAlchemy URL of the server's maintenance database
  migrated_template  (session) name of a database migrated to head, template of the fresh ones
  migrated_db_url    (function) asyncpg SQLAlchemy URL of a fresh database migrated to head
  empty_db_url       (function) asyncpg SQLAlchemy URL of a fresh empty database
  pg_home            (function) a fresh directory outside pytest's tmp tree, for an embedded server
  redis_server_url   (session) URL of the Redis server
  redis_url          (function) the same, database flushed before the test
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class PostgresServer:
    """A PostgreSQL server the tests may create and drop databases on."""

    admin_url: str  # libpq URL of a database to run CREATE/DROP DATABASE from
    embedded: Any = field(default=None, repr=False)

    def url(self, database: str, driver: str = "async") -> str:
        from memci_proxy.store.sql.urls import to_async_url, to_libpq_url, to_sync_url, with_database

        convert = {"async": to_async_url, "sync": to_sync_url, "libpq": to_libpq_url}[driver]
        return with_database(convert(self.admin_url), database)

    def _execute(self, statement: Any) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement)

    def create_database(self, name: str, template: str | None = None) -> None:
        from psycopg import sql

        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
        self._execute(statement)

    def drop_database(self, name: str) -> None:
        from psycopg import sql

        self._execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def pytest_configure(config: pytest.Config) -> None:
    # pgserver asks platformdirs for a runtime dir; without XDG_RUNTIME_DIR it falls back to /tmp (fine).
    config.addinivalue_line("filterwarnings", "ignore:XDG_RUNTIME_DIR is not set:UserWarning")


# The order the suite runs in: the fast levels first, and the tests on the real engines last, so that the engines'
# first builds (started in the background by scripts/prebuild-engines.sh) run beside everything else.
_LEVELS = ("unit", "integration", "resilience", "e2e")
_ENGINE_MODULES = frozenset({"test_real_engine.py", "test_sglang.py", "test_sglang_workers.py"})


def _run_order(item: pytest.Item) -> tuple[int, int]:
    parts = Path(str(item.fspath)).parts
    level = next((i for i, name in enumerate(_LEVELS) if name in parts), len(_LEVELS))
    return level, int(parts[-1] in _ENGINE_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_run_order)  # stable: the order within a level stays the files' own


@pytest.fixture
def pg_home() -> Iterator[Path]:
    """A fresh directory an embedded PostgreSQL may live in (removed afterwards)."""
    base = Path(tempfile.mkdtemp(prefix="memci-test-home-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _unique_name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    from memci_proxy.store.sql.urls import to_libpq_url

    external = os.environ.get("DATABASE_URL")
    if external:
        yield PostgresServer(admin_url=to_libpq_url(external))
        return
    from memci_proxy.store.sql.embedded import start_embedded_postgres

    # Not under pytest's tmp_path: pytest makes that tree private to root (and removes old runs),
    # while the server runs as the unprivileged user pgserver.
    base = Path(tempfile.mkdtemp(prefix="memci-test-pg-"))
    embedded = start_embedded_postgres(base / "data", cleanup_mode="delete")
    try:
        server = PostgresServer(admin_url=embedded.url_of("postgres", "libpq"), embedded=embedded)
        # A throw-away server: durability off makes CREATE/DROP DATABASE per test several times faster.
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            server._execute(f"ALTER SYSTEM SET {setting} = off")
        server._execute("SELECT pg_reload_conf()")
        yield server
    finally:
        embedded.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    from memci_proxy.store.sql.urls import database_of, to_async_url

    return postgres_server.url(database_of(to_async_url(postgres_server.admin_url)) or "postgres")


@pytest.fixture(scope="session")
def migrated_template(postgres_server: PostgresServer) -> Iterator[str]:
    from memci_proxy.store.sql.migrate import run_migrations

    name = _unique_name("memci_tpl")
    postgres_server.create_database(name)
    try:
        run_migrations(postgres_server.url(name, "sync"))
        yield name
    finally:
        postgres_server.drop_database(name)


@pytest.fixture
def migrated_db_url(postgres_server: PostgresServer, migrated_template: str) -> Iterator[str]:
    name = _unique_name("memci_t")
    postgres_server.create_database(name, template=migrated_template)
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


@pytest.fixture
def empty_db_url(postgres_server: PostgresServer) -> Iterator[str]:
    name = _unique_name("memci_e")
    postgres_server.create_database(name)
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.drop_database(name)


# --- Redis ----------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_redis(url: str, process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    import redis

    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with status {process.returncode}")
            try:
                if client.ping():
                    return
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    external = os.environ.get("REDIS_URL")
    if external:
        yield external
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed and REDIS_URL is not set")
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_for_redis(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def redis_url(redis_server_url: str) -> str:
    import redis

    client = redis.Redis.from_url(redis_server_url)
    try:
        client.flushdb()
    finally:
        client.close()
    return redis_server_url
