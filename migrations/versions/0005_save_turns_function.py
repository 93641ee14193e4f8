"""memci_save_turns: several conversations' turns stored in one statement (one round trip, one transaction).

Each conversation's snapshot is compared and set first (on the stored version and the md5 of the stored state, or
only on an older version when no base is given); the rows of the conversations that applied follow, entries before
pages so that the pages_tsv trigger sees the new messages. Returns the ids that applied. The upserts keep the rules
of memci_proxy/store/sql/turn_statements.py.

Revision ID: 0005_save_turns_function
Revises: 0004_memory_summaries
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005_save_turns_function"
down_revision: str | None = "0004_memory_summaries"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SIGNATURE = (
    "text[], text[], bytea[], bigint[], bigint[], text[], boolean[], "
    "text[], integer[], text[], text[], text[], integer[], "
    "text[], text[], integer[], integer[], text[], integer[], text[], integer[], integer[], "
    "text[], text[], text[], integer[], "
    "text[], integer[], integer[], text[], "
    "text[], integer[], text[], "
    "text[], text[], text[], text[]"
)

SAVE_TURNS = """
CREATE OR REPLACE FUNCTION memci_save_turns(
    w_ids text[], w_tenants text[], w_states bytea[], w_versions bigint[], w_base_versions bigint[],
    w_base_digests text[], w_has_base boolean[],
    e_cids text[], e_seqs integer[], e_hashes text[], e_roles text[], e_messages text[], e_tokens integer[],
    p_cids text[], p_numbers text[], p_first integer[], p_last integer[], p_states text[], p_tokens integer[],
    p_summaries text[], p_recall integer[], p_last_recalled integer[],
    f_tenants text[], f_hashes text[], f_cids text[], f_lengths integer[],
    h_cids text[], h_after integer[], h_ordinals integer[], h_messages text[],
    k_cids text[], k_epochs integer[], k_texts text[],
    v_tenants text[], v_cids text[], v_kinds text[], v_payloads text[]
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    applied text[];
BEGIN
    WITH w AS (
        SELECT * FROM unnest(w_ids, w_tenants, w_states, w_versions, w_base_versions, w_base_digests, w_has_base)
            AS w(id, tenant, state, version, base_version, base_digest, has_base)
    ), cas AS (
        UPDATE conversations c
        SET state = w.state, state_version = w.version, updated_at = now(), last_active_at = now()
        FROM w
        WHERE c.id = w.id AND c.tenant = w.tenant AND (
            (w.has_base AND c.state_version = w.base_version AND md5(c.state) IS NOT DISTINCT FROM w.base_digest)
            OR (NOT w.has_base AND c.state_version < w.version))
        RETURNING c.id
    )
    SELECT coalesce(array_agg(cas.id), '{}') INTO applied FROM cas;
    IF cardinality(applied) = 0 THEN
        RETURN;
    END IF;

    INSERT INTO entries AS t (conversation_id, seq, hash, role, message, tokens)
    SELECT r.cid, r.seq, r.hash, r.role, r.message::jsonb, r.tokens
    FROM unnest(e_cids, e_seqs, e_hashes, e_roles, e_messages, e_tokens) AS r(cid, seq, hash, role, message, tokens)
    WHERE r.cid = ANY(applied)
    ON CONFLICT (conversation_id, seq) DO UPDATE
        SET hash = EXCLUDED.hash, role = EXCLUDED.role, message = EXCLUDED.message, tokens = EXCLUDED.tokens
        WHERE t.hash <> EXCLUDED.hash;

    INSERT INTO pages AS t (conversation_id, number, first_seq, last_seq, state, tokens, summary, recall_count,
                            last_recalled_turn, archived_at)
    SELECT r.cid, r.number, r.first_seq, r.last_seq, r.state, r.tokens, r.summary, r.recall_count,
           r.last_recalled_turn, CASE WHEN r.state = 'active' THEN NULL ELSE now() END
    FROM unnest(p_cids, p_numbers, p_first, p_last, p_states, p_tokens, p_summaries, p_recall, p_last_recalled)
        AS r(cid, number, first_seq, last_seq, state, tokens, summary, recall_count, last_recalled_turn)
    WHERE r.cid = ANY(applied)
    ORDER BY r.cid, r.first_seq
    ON CONFLICT (conversation_id, number) DO UPDATE
        SET first_seq = EXCLUDED.first_seq, last_seq = EXCLUDED.last_seq, state = EXCLUDED.state,
            tokens = EXCLUDED.tokens, summary = EXCLUDED.summary,
            recall_count = greatest(t.recall_count, EXCLUDED.recall_count),
            last_recalled_turn = greatest(t.last_recalled_turn, EXCLUDED.last_recalled_turn),
            archived_at = CASE WHEN EXCLUDED.state = 'active' THEN NULL
                               ELSE coalesce(t.archived_at, EXCLUDED.archived_at) END
        WHERE t.first_seq <> EXCLUDED.first_seq OR t.last_seq <> EXCLUDED.last_seq OR t.state <> EXCLUDED.state
           OR t.tokens <> EXCLUDED.tokens OR t.summary <> EXCLUDED.summary OR t.recall_count < EXCLUDED.recall_count
           OR coalesce(t.last_recalled_turn, -1) < coalesce(EXCLUDED.last_recalled_turn, -1);

    INSERT INTO fingerprints (tenant, chain_hash, conversation_id, length)
    SELECT r.tenant, r.hash, r.cid, r.length
    FROM unnest(f_tenants, f_hashes, f_cids, f_lengths) AS r(tenant, hash, cid, length)
    WHERE r.cid = ANY(applied)
    ON CONFLICT (tenant, chain_hash) DO NOTHING;

    INSERT INTO hidden_messages (conversation_id, after_seq, ordinal, message)
    SELECT r.cid, r.after_seq, r.ordinal, r.message::jsonb
    FROM unnest(h_cids, h_after, h_ordinals, h_messages) AS r(cid, after_seq, ordinal, message)
    WHERE r.cid = ANY(applied)
    ON CONFLICT (conversation_id, after_seq, ordinal) DO UPDATE SET message = EXCLUDED.message;

    INSERT INTO contents_snapshots (conversation_id, epoch, text)
    SELECT r.cid, r.epoch, r.text
    FROM unnest(k_cids, k_epochs, k_texts) AS r(cid, epoch, text)
    WHERE r.cid = ANY(applied)
    ON CONFLICT (conversation_id, epoch) DO UPDATE SET text = EXCLUDED.text;

    INSERT INTO events (tenant, conversation_id, kind, payload)
    SELECT r.tenant, r.cid, r.kind, r.payload::jsonb
    FROM unnest(v_tenants, v_cids, v_kinds, v_payloads) AS r(tenant, cid, kind, payload)
    WHERE r.cid = ANY(applied);

    RETURN QUERY SELECT unnest(applied);
END
$$;
"""


def upgrade() -> None:
    op.execute(SAVE_TURNS)


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS memci_save_turns({SIGNATURE})")
