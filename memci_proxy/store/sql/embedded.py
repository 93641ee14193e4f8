"""Embedded PostgreSQL (with pgvector) from the ``pgserver`` wheel, for machines without a database.

The server listens on a unix socket inside its data directory only (no TCP port). Several
processes (server workers) may start it on the same directory: pgserver shares one server between
them and stops it when the last one exits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql

from memci_proxy.store.sql.urls import to_async_url, to_libpq_url, to_sync_url, with_database

logger = logging.getLogger("memci.store")

DEFAULT_DATABASE = "memci"


@dataclass
class EmbeddedPostgres:
    """A running embedded server and URLs of its ``database``."""

    data_dir: Path
    server_uri: str  # libpq URI of the maintenance database "postgres", as pgserver reports it
    database: str = DEFAULT_DATABASE
    _server: Any = field(default=None, repr=False)

    @property
    def async_url(self) -> str:
        """SQLAlchemy URL over asyncpg (the repository's)."""
        return with_database(to_async_url(self.server_uri), self.database)

    @property
    def sync_url(self) -> str:
        """SQLAlchemy URL over psycopg (migrations, admin work)."""
        return with_database(to_sync_url(self.server_uri), self.database)

    @property
    def libpq_url(self) -> str:
        return with_database(to_libpq_url(self.server_uri), self.database)

    def url_of(self, database: str, driver: str = "async") -> str:
        convert = {"async": to_async_url, "sync": to_sync_url, "libpq": to_libpq_url}[driver]
        return with_database(convert(self.server_uri), database)

    def stop(self) -> None:
        """Release this process's handle; the server stops when no process holds one."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None


def create_database_if_missing(server_libpq_url: str, database: str, template: str | None = None) -> bool:
    """CREATE DATABASE ``database`` unless it exists; True when it was created."""
    with psycopg.connect(server_libpq_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if exists:
            return False
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database))
        if template:
            statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
        try:
            conn.execute(statement)
        except (pg_errors.DuplicateDatabase, pg_errors.UniqueViolation):
            # another process won the race: its CREATE DATABASE committed first (DuplicateDatabase), or the two
            # inserted into pg_database at once (the catalog's unique index: several server workers starting)
            return False
        return True


def start_embedded_postgres(
    home: Path, database: str = DEFAULT_DATABASE, cleanup_mode: str | None = "stop"
) -> EmbeddedPostgres:
    """Start (or join) the embedded server whose data directory is ``home``; create ``database``.

    ``cleanup_mode``: "stop" stops the server when the last process using it exits, "delete" also
    removes the data directory (tests), None leaves it running.
    Blocking (runs pg_ctl): call it through ``asyncio.to_thread`` from async code.
    """
    import pgserver  # imported here: it pulls in psutil and platformdirs, not needed with an external database

    home = Path(home).expanduser().resolve()
    home.parent.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(home, cleanup_mode=cleanup_mode)
    uri = server.get_uri()
    created = create_database_if_missing(uri, database)
    logger.info(
        "embedded PostgreSQL at %s (pid %s)%s",
        home,
        server.get_pid(),
        f", database {database} created" if created else "",
    )
    return EmbeddedPostgres(data_dir=home, server_uri=uri, database=database, _server=server)
