"""The user pages' term index keeps a short pending list: 256 kB instead of the server's 4 MB default.

A GIN index with ``fastupdate`` (PostgreSQL's default) appends new entries to a pending list that every search reads
whole until it is merged into the index (by VACUUM, autoanalyze, or an insert that finds it over
``gin_pending_list_limit``). ``ix_user_pages_terms`` is one index for every user of every tenant and gets a page after
each turn with a user id, so in a busy deployment its pending list is rarely short: every search of a user's other
conversations (the push, on the request path) read up to 4 MB of it. Measured with `loadtests/bench_user_memory.py`'s
data, one page written between two searches: a user with 50,000 pages searched in p50 12.4 ms and p99 20.9 ms with the
default, 7.0 and 10.9 ms at 256 kB; the index scan itself went from 5-6 ms to 0.04 ms once the list was merged. An
insert that finds the list full merges it: at most 256 kB at a time (70 ms once the 4 MB list filled, 25 ms at most
here), behind the answer.

Upgrade: the index's ``gin_pending_list_limit`` set to 256 (kB). Downgrade: reset to the server's setting.

Revision ID: 0011_user_terms_pending_list
Revises: 0010_epoch_pages_indexed_behind
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011_user_terms_pending_list"
down_revision: str | None = "0010_epoch_pages_indexed_behind"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PENDING_LIST_KB = 256  # memci_proxy.store.sql.memory_models.USER_TERMS_PENDING_KB at the time of this revision


def upgrade() -> None:
    op.execute(f"ALTER INDEX ix_user_pages_terms SET (gin_pending_list_limit = {PENDING_LIST_KB})")


def downgrade() -> None:
    op.execute("ALTER INDEX ix_user_pages_terms RESET (gin_pending_list_limit)")
