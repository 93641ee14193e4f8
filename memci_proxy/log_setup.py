"""Logging of every command: one format, the level of the ``log_level`` setting (``--log-level``), and the
libraries' chatter kept for debugging: the embedded PostgreSQL's initdb and pg_ctl output (``pgserver``) and the
migrations' steps (``alembic``) show only at ``debug``. At ``info`` a first start says what it created in one
line each (memci_proxy.store), then ``ready on http://...``."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Loggers that speak at INFO about their own steps (about 100 lines on a first start): WARNING and up unless debug.
CHATTY = ("pgserver", "alembic")


def configure_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    logging.basicConfig(level=numeric, format=FORMAT)
    logging.getLogger().setLevel(numeric)  # the server may have configured logging first
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET if numeric <= logging.DEBUG else max(numeric, logging.WARNING))
