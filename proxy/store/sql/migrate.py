"""Run the Alembic migrations from code (the CLI's ``migrate``, the embedded start-up, tests).

Synchronous: call it from a thread (``asyncio.to_thread``) inside an event loop.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from proxy.store.sql.urls import to_sync_url

REPO_ROOT = Path(__file__).resolve().parents[3]
MIGRATIONS_DIR = REPO_ROOT / "migrations"
ALEMBIC_INI = REPO_ROOT / "alembic.ini"


def alembic_config(database_url: str) -> Config:
    """An Alembic Config pointing at this project's migrations and ``database_url``."""
    config = Config(str(ALEMBIC_INI)) if ALEMBIC_INI.exists() else Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = database_url
    return config


def run_migrations(database_url: str, revision: str = "head") -> None:
    """Upgrade the schema of ``database_url`` (any PostgreSQL URL form) to ``revision``."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    """Downgrade the schema of ``database_url`` to ``revision`` (``"base"``: nothing left)."""
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations have {len(heads)} heads: {heads}")
    return heads[0]


def current_revision(database_url: str) -> str | None:
    """The revision the database is at (None: never migrated)."""
    engine = create_engine(to_sync_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
