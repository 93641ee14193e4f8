"""The pages an epoch archives are full-text indexed behind the answer, not in the write before the upstream call.

At an epoch the proxy stores the pages leaving the prompt before the request that omits them (the durability rule).
The pages_tsv trigger (0007) computed each one's tsvector in that write: jsonb_to_tsvector over the page's messages
and its GIN entry, the larger part of the epoch's write (about 6 ms against 2.5 ms without it, p50, 150-turn chat).
memci_save_turns now has a 38th argument, ``index_behind``: when true, a page that must be indexed keeps tsv NULL
(the trigger reads the transaction-local setting ``memci.index_behind``), and the proxy indexes it after the answer
(``UPDATE pages SET tsv = NULL`` on it: the trigger computes then). The 37-argument function is unchanged.
ix_pages_unindexed finds the non-active pages still without a tsvector (a process that stopped in between: indexed
when the next one starts).

Upgrade: the trigger function reads the setting; the 38-argument memci_save_turns; the partial index.
Downgrade: 0007's trigger function; the 38-argument function and the index dropped; the pages left unindexed
get their tsvector.

Revision ID: 0010_epoch_pages_indexed_behind
Revises: 0009_end_users
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0010_epoch_pages_indexed_behind"
down_revision: str | None = "0009_end_users"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TSV_CONFIG = "simple"  # memci_proxy.store.sql.models.TSV_CONFIG at the time of this revision

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


def _function(behind: str) -> str:
    return f"""
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
    END IF;{behind}
    NEW.tsv := {PAGE_TSV};
    RETURN NEW;
END
$$;
"""


PAGES_TSV_FUNCTION = _function("""
    IF current_setting('memci.index_behind', true) = 'on' THEN
        NEW.tsv := NULL;  -- indexed behind the answer (memci_proxy.turn.states: index_pages)
        RETURN NEW;
    END IF;""")
PAGES_TSV_FUNCTION_0007 = _function("")

# memci_save_turns' 37 arguments: 0005's SIGNATURE, verbatim (a migration stands alone, as 0007 copies 0001)
SIGNATURE = (
    "text[], text[], bytea[], bigint[], bigint[], text[], boolean[], "
    "text[], integer[], text[], text[], text[], integer[], "
    "text[], text[], integer[], integer[], text[], integer[], text[], integer[], integer[], "
    "text[], text[], text[], integer[], "
    "text[], integer[], integer[], text[], "
    "text[], integer[], text[], "
    "text[], text[], text[], text[]"
)
ARGUMENTS = ", ".join(f"${i}" for i in range(1, 38))
SAVE_TURNS_BEHIND = f"""
CREATE OR REPLACE FUNCTION memci_save_turns({SIGNATURE}, boolean) RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
    IF $38 THEN
        PERFORM set_config('memci.index_behind', 'on', true);
    END IF;
    RETURN QUERY SELECT memci_save_turns({ARGUMENTS});
    PERFORM set_config('memci.index_behind', 'off', true);
END
$$;
"""


def upgrade() -> None:
    op.execute(PAGES_TSV_FUNCTION)
    op.execute(SAVE_TURNS_BEHIND)
    op.execute("CREATE INDEX ix_pages_unindexed ON pages (conversation_id) WHERE tsv IS NULL AND state <> 'active'")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_pages_unindexed")
    op.execute(f"DROP FUNCTION IF EXISTS memci_save_turns({SIGNATURE}, boolean)")
    op.execute(PAGES_TSV_FUNCTION_0007)
    op.execute("UPDATE pages SET tsv = NULL WHERE tsv IS NULL AND state <> 'active'")  # the trigger computes them
