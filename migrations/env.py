"""Alembic environment of the Memci proxy.

URL, first found: ``config.attributes["database_url"]`` (set by memci_proxy.store.sql.migrate), the
``sqlalchemy.url`` option, the ``DATABASE_URL`` environment variable. Any PostgreSQL URL form is
accepted (asyncpg ones too); migrations run over the synchronous psycopg driver, under a
PostgreSQL advisory lock so that several replicas starting at once migrate one at a time.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool, text

from memci_proxy.store.sql.models import Base
from memci_proxy.store.sql.urls import to_sync_url

# Arbitrary constant shared by every process that migrates this schema.
MIGRATION_LOCK_KEY = 7_362_019_451

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = (
        config.attributes.get("database_url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("DATABASE_URL", "")
    )
    if not url:
        raise RuntimeError("no database URL: set DATABASE_URL or pass one to memci_proxy.store.sql.migrate")
    return to_sync_url(url)


def run_migrations_offline() -> None:
    context.configure(
        url=_database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(_database_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            connection.commit()
            try:
                context.configure(connection=connection, target_metadata=target_metadata)
                with context.begin_transaction():
                    context.run_migrations()
                connection.commit()
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
