"""Keep pages.tsv current when an entry is edited in place (an edited history under a session key).

Revision ID: 0002_entries_touch_pages
Revises: 0001_initial
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0002_entries_touch_pages"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Setting tsv to NULL makes the pages_tsv trigger recompute it from the page's entries.
TOUCH_FUNCTION = """
CREATE OR REPLACE FUNCTION memci_entries_touch_pages() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pages SET tsv = NULL
    WHERE conversation_id = NEW.conversation_id
      AND NEW.seq BETWEEN first_seq AND last_seq;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    op.execute(TOUCH_FUNCTION)
    op.execute(
        "CREATE TRIGGER entries_touch_pages AFTER UPDATE OF message ON entries "
        "FOR EACH ROW WHEN (OLD.message IS DISTINCT FROM NEW.message) "
        "EXECUTE FUNCTION memci_entries_touch_pages()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS entries_touch_pages ON entries")
    op.execute("DROP FUNCTION IF EXISTS memci_entries_touch_pages()")
