"""Run the Alembic migrations from code (the CLI's ``migrate``, the embedded start-up, tests).

Synchronous: call it from a thread (``asyncio.to_thread``) inside an event loop.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from memci_proxy import package_data
from memci_proxy.store.sql.urls import to_sync_url

MIGRATIONS_DIR = package_data.path("migrations")  # the checkout's, or the wheel's copy
ALEMBIC_INI = package_data.CHECKOUT / "alembic.ini"  # a checkout's (the `alembic` command's); a wheel runs without


def alembic_config(database_url: str) -> Config:
    """An Alembic Config pointing at this project's migrations and ``database_url``."""
    config = Config(str(ALEMBIC_INI)) if package_data.is_checkout() and ALEMBIC_INI.exists() else Config()
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
