"""Active pages are not full-text indexed: pages.tsv stays NULL while a page is active.

The active pages are in the prompt, and the active last page changes range on almost every turn: recomputing its
tsvector (jsonb_to_tsvector over its entries) and its GIN entry on every turn was the largest part of the
database's CPU per turn. The tsvector is now computed when a page is stored non-active or leaves 'active', and
recomputed as before when a non-active page's summary or range changes or when memci_entries_touch_pages (0002)
sets its tsv to NULL after an entry edit. A non-active page found without a tsvector gets one on its next update.
An upsert of a stored page no longer computes a tsvector for its proposed row (BEFORE INSERT fires for it too, and
that value was thrown away): re-sending unchanged archived pages (every page at an epoch) computed one per page.

Upgrade: the active pages' tsvectors are removed (and with them their GIN entries).
Downgrade: 0001's function again, and the active pages get their tsvectors back.

Revision ID: 0007_active_pages_unindexed
Revises: 0006_blob_refs_and_virtual_keys
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0007_active_pages_unindexed"
down_revision: str | None = "0006_blob_refs_and_virtual_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TSV_CONFIG = "simple"  # memci_proxy.store.sql.models.TSV_CONFIG at the time of this revision

# The tsvector of a page: summary (weight A) + the text of the page's messages (content, tool calls; weight B).
PAGE_TSV = f"""setweight(to_tsvector('{TSV_CONFIG}', coalesce(NEW.summary, '')), 'A')
        || setweight(coalesce((
            SELECT jsonb_to_tsvector(
                '{TSV_CONFIG}',
                jsonb_agg(jsonb_build_array(e.message -> 'content', e.message -> 'tool_calls') ORDER BY e.seq),
                '["string"]')
            FROM entries e
            WHERE e.conversation_id = NEW.conversation_id
              AND e.seq BETWEEN NEW.first_seq AND NEW.last_seq
        ), ''::tsvector), 'B')"""

# INSERT ... ON CONFLICT DO UPDATE fires BEFORE INSERT for every proposed row, conflicting or not: a page re-sent
# unchanged (every page at an epoch, recall counts) computed a tsvector that was thrown away. A proposed row whose
# key is stored is left alone (a page is deleted only with its conversation, and then the insert fails on its
# foreign key).
# Kept as is: an update of a non-active page that had a tsvector and keeps its state's content (summary, range,
# tsv) -- a recall-count update, archived -> evicted. Anything else of a non-active page computes: its insert, its
# leaving 'active' (OLD.tsv and NEW.tsv are both NULL then), a new summary or range, tsv set NULL by an entry edit.
PAGES_TSV_FUNCTION = f"""
CREATE OR REPLACE FUNCTION memci_pages_tsv() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'active' THEN
        NEW.tsv := NULL;
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' AND EXISTS (
        SELECT 1 FROM pages p WHERE p.conversation_id = NEW.conversation_id AND p.number = NEW.number) THEN
        RETURN NEW;  -- an upsert of a stored page: the BEFORE UPDATE firing decides, this row's tsv is not kept
    END IF;
    IF TG_OP = 'UPDATE'
       AND OLD.state <> 'active'
       AND NEW.tsv IS NOT NULL
       AND NEW.tsv IS NOT DISTINCT FROM OLD.tsv
       AND NEW.summary IS NOT DISTINCT FROM OLD.summary
       AND NEW.first_seq = OLD.first_seq
       AND NEW.last_seq = OLD.last_seq THEN
        RETURN NEW;
    END IF;
    NEW.tsv := {PAGE_TSV};
    RETURN NEW;
END
$$;
"""

# 0001's function, verbatim.
PAGES_TSV_FUNCTION_0001 = f"""
CREATE OR REPLACE FUNCTION memci_pages_tsv() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND NEW.summary IS NOT DISTINCT FROM OLD.summary
       AND NEW.first_seq = OLD.first_seq
       AND NEW.last_seq = OLD.last_seq
       AND NEW.tsv IS NOT DISTINCT FROM OLD.tsv THEN
        RETURN NEW;
    END IF;
    NEW.tsv := {PAGE_TSV};
    RETURN NEW;
END
$$;
"""


def upgrade() -> None:
    op.execute(PAGES_TSV_FUNCTION)
    op.execute("UPDATE pages SET tsv = NULL WHERE state = 'active' AND tsv IS NOT NULL")


def downgrade() -> None:
    op.execute(PAGES_TSV_FUNCTION_0001)
    # 0001's function computes when tsv changes: an empty tsvector in place of NULL makes it compute.
    op.execute("UPDATE pages SET tsv = ''::tsvector WHERE tsv IS NULL")
