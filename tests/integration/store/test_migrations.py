"""The Alembic migrations on a real PostgreSQL with pgvector."""

from __future__ import annotations

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, pool

from memci_proxy.store.sql.memory_models import USER_TERMS_PENDING_KB
from memci_proxy.store.sql.migrate import current_revision, downgrade, head_revision, run_migrations
from memci_proxy.store.sql.models import Base
from memci_proxy.store.sql.urls import to_libpq_url, to_sync_url

TABLES = {"conversations", "entries", "pages", "fingerprints", "hidden_messages", "contents_snapshots", "events"}


def _tables(url: str) -> set[str]:
    with psycopg.connect(to_libpq_url(url)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {name for (name,) in rows}


def _has_vector_extension(url: str) -> bool:
    with psycopg.connect(to_libpq_url(url)) as conn:
        return conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is not None


def test_upgrade_downgrade_upgrade(empty_db_url: str) -> None:
    assert current_revision(empty_db_url) is None

    run_migrations(empty_db_url)
    assert current_revision(empty_db_url) == head_revision()
    assert TABLES <= _tables(empty_db_url)
    assert _has_vector_extension(empty_db_url)

    downgrade(empty_db_url, "base")
    assert current_revision(empty_db_url) is None
    assert not (TABLES & _tables(empty_db_url))

    run_migrations(empty_db_url)
    assert current_revision(empty_db_url) == head_revision()
    assert TABLES <= _tables(empty_db_url)


def test_migrating_twice_is_a_no_op(migrated_db_url: str) -> None:
    run_migrations(migrated_db_url)
    assert current_revision(migrated_db_url) == head_revision()


def test_models_match_the_migrated_schema(migrated_db_url: str) -> None:
    engine = create_engine(to_sync_url(migrated_db_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            differences = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert differences == []


def test_page_state_is_checked(migrated_db_url: str) -> None:
    with psycopg.connect(to_libpq_url(migrated_db_url)) as conn:
        conn.execute("INSERT INTO conversations (id, tenant) VALUES ('c', 't')")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO pages (conversation_id, number, first_seq, last_seq, state, tokens, summary) "
                "VALUES ('c', '1', 0, 1, 'lost', 10, '')"
            )


def test_session_key_is_unique_per_tenant_only_when_set(migrated_db_url: str) -> None:
    with psycopg.connect(to_libpq_url(migrated_db_url)) as conn:
        conn.execute(
            "INSERT INTO conversations (id, tenant, session_key) VALUES "
            "('a', 't1', 'k'), ('b', 't2', 'k'), ('c', 't1', NULL), ('d', 't1', NULL)"
        )
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO conversations (id, tenant, session_key) VALUES ('e', 't1', 'k')")


def test_alembic_command_line_takes_database_url(empty_db_url: str) -> None:
    import os
    import subprocess
    import sys

    from memci_proxy.package_data import CHECKOUT as REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=REPO_ROOT,
        env={**os.environ, "DATABASE_URL": empty_db_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert current_revision(empty_db_url) == head_revision()


def test_active_pages_lose_their_tsvector_in_0007_and_get_it_back_on_downgrade(empty_db_url: str) -> None:
    def tsv_by_page() -> dict[str, bool]:
        with psycopg.connect(to_libpq_url(empty_db_url)) as conn:
            rows = conn.execute("SELECT number, tsv IS NOT NULL FROM pages ORDER BY number").fetchall()
        return dict(rows)

    run_migrations(empty_db_url, "0006_blob_refs_and_virtual_keys")
    with psycopg.connect(to_libpq_url(empty_db_url)) as conn:
        conn.execute("INSERT INTO conversations (id, tenant) VALUES ('c', 't')")
        conn.execute(
            "INSERT INTO entries (conversation_id, seq, hash, role, message, tokens) VALUES "
            "('c', 0, 'a', 'user', '{\"content\": \"kyoto\"}', 1), ('c', 1, 'b', 'user', '{\"content\": \"osaka\"}', 1)"
        )
        conn.execute(
            "INSERT INTO pages (conversation_id, number, first_seq, last_seq, state, tokens) VALUES "
            "('c', '1', 0, 0, 'archived', 1), ('c', '2', 1, 1, 'active', 1)"
        )
    assert tsv_by_page() == {"1": True, "2": True}

    run_migrations(empty_db_url)
    assert tsv_by_page() == {"1": True, "2": False}

    downgrade(empty_db_url, "0006_blob_refs_and_virtual_keys")
    assert tsv_by_page() == {"1": True, "2": True}
    with psycopg.connect(to_libpq_url(empty_db_url)) as conn:
        found = conn.execute("SELECT number FROM pages WHERE tsv @@ to_tsquery('simple', 'osaka')").fetchall()
    assert found == [("2",)]


def test_the_user_pages_term_index_keeps_a_short_pending_list_until_downgraded(empty_db_url: str) -> None:
    def options() -> list[str]:
        with psycopg.connect(to_libpq_url(empty_db_url)) as conn:
            row = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'ix_user_pages_terms'").fetchone()
        return list(row[0] or [])

    run_migrations(empty_db_url)
    assert options() == [f"gin_pending_list_limit={USER_TERMS_PENDING_KB}"]
    downgrade(empty_db_url, "0010_epoch_pages_indexed_behind")
    assert options() == []
    run_migrations(empty_db_url)
    assert options() == [f"gin_pending_list_limit={USER_TERMS_PENDING_KB}"]
