"""Conversions between the PostgreSQL URL forms the proxy meets.

Operators give ``postgresql://`` (or ``postgres://``) URLs; SQLAlchemy needs a driver name
(``postgresql+asyncpg`` at run time, ``postgresql+psycopg`` for migrations and admin work), and
libpq tools (psycopg's ``connect``) want the plain form again.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url

ASYNC_DRIVER = "postgresql+asyncpg"
SYNC_DRIVER = "postgresql+psycopg"

# libpq's sslmode spelled as asyncpg's ``ssl`` argument.
_SSLMODE_PARAM = "sslmode"


def _parse(url: str | URL) -> URL:
    parsed = make_url(url) if isinstance(url, str) else url
    if parsed.drivername == "postgres" or parsed.drivername.startswith("postgres+"):
        parsed = parsed.set(drivername=parsed.drivername.replace("postgres", "postgresql", 1))
    if not parsed.drivername.startswith("postgresql"):
        raise ValueError(f"not a PostgreSQL URL: {parsed.render_as_string(hide_password=True)}")
    return parsed


def _render(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def to_async_url(url: str | URL) -> str:
    """``postgresql+asyncpg://`` form of any PostgreSQL URL."""
    parsed = _parse(url).set(drivername=ASYNC_DRIVER)
    query = dict(parsed.query)
    if _SSLMODE_PARAM in query:
        query["ssl"] = query.pop(_SSLMODE_PARAM)
        parsed = parsed.set(query=query)
    return _render(parsed)


def to_sync_url(url: str | URL) -> str:
    """``postgresql+psycopg://`` form (migrations, admin statements)."""
    parsed = _parse(url).set(drivername=SYNC_DRIVER)
    query = dict(parsed.query)
    if "ssl" in query and _SSLMODE_PARAM not in query:
        query[_SSLMODE_PARAM] = query.pop("ssl")
        parsed = parsed.set(query=query)
    return _render(parsed)


def to_libpq_url(url: str | URL) -> str:
    """Plain ``postgresql://`` form, as libpq and psycopg.connect take it."""
    return _render(_parse(to_sync_url(url)).set(drivername="postgresql"))


def with_database(url: str | URL, database: str) -> str:
    """The same server and credentials, another database; keeps the driver of ``url``."""
    return _render(_parse(url).set(database=database))


def database_of(url: str | URL) -> str | None:
    return _parse(url).database


def redact(url: str | URL) -> str:
    """The URL with its password hidden, for logs."""
    return _parse(url).render_as_string(hide_password=True)
