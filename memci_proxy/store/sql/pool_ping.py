"""Liveness of pooled connections, checked where it is in doubt.

SQLAlchemy's ``pool_pre_ping`` pings at every checkout; with asyncpg a ping is a BEGIN and a ROLLBACK, two round
trips before a query that itself takes three (BEGIN, the query, ROLLBACK or COMMIT). The memory workers make a dozen
short reads and writes per epoch, each on a connection of its own: half their round trips were pings. Here a
connection is pinged at checkout only when it has been idle in the pool for more than ``PING_AFTER_IDLE_S``: one
checked in moments ago is alive but for a server restart in between, which the pool handles as any error that
breaks a connection (the statement fails, the pool drops its connections, the next checkout connects anew). A ping
that fails replaces the connection before use: the pool retries the checkout on ``DisconnectionError``, up to three
times.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine

PING_AFTER_IDLE_S = 5.0
_IDLE_SINCE = "memci_idle_since"  # in the connection record's info (reset with the DBAPI connection)


def ping_when_idle(engine: AsyncEngine, after_s: float | None = None) -> None:
    """Ping a connection at checkout when it has waited in the pool for more than ``after_s`` seconds (by default
    PING_AFTER_IDLE_S, read at each checkout)."""
    sync = engine.sync_engine

    @event.listens_for(sync, "checkin")
    def _checked_in(dbapi_connection: Any, record: Any) -> None:
        if dbapi_connection is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(sync, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None or time.monotonic() - since <= (PING_AFTER_IDLE_S if after_s is None else after_s):  # new, or back in the pool moments ago
            return
        try:
            sync.dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise DisconnectionError(f"a pooled connection failed its ping: {type(exc).__name__}") from exc
