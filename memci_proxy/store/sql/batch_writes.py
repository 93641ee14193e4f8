"""The hot writes, on the driver's connection: a new conversation in one statement, and several conversations'
turns stored in one round trip by the function memci_save_turns (migration 0005), called with one array per column
(no ORM work per row, no BEGIN/COMMIT round trips: one statement is one transaction). Text and JSON are escaped
where they hold what PostgreSQL cannot store (memci_proxy.store.sql.pgtext), as every write of the adapter does."""

from __future__ import annotations

from typing import Any

from memci_proxy.store.ports import BEHIND, NOT_FOUND, REPLAYED, SAVED, STALE, TurnWrite, snapshot_digest
from memci_proxy.store.sql.pgtext import dumps as _text
from memci_proxy.store.sql.pgtext import escape

CREATE = ("INSERT INTO conversations (id, tenant, session_key, end_user) VALUES ($1, $2, $3, $4) "
          "ON CONFLICT DO NOTHING RETURNING id")
SAVE_TURNS = "SELECT memci_save_turns(" + ", ".join(f"${i}" for i in range(1, 39)) + ")"  # 0010: index behind
CURRENT = "SELECT id, tenant, state_version, md5(state) AS digest FROM conversations WHERE id = ANY($1::text[])"


def arguments(writes: list[TurnWrite]) -> list[list[Any]]:
    """The function's 37 array arguments, column by column."""
    columns: list[list[Any]] = [[] for _ in range(37)]
    for w in writes:
        cid = w.conversation_id
        for column, value in zip(columns[0:7], (
            cid, w.tenant, w.snapshot, w.version, w.base.version if w.base else None,
            w.base.digest if w.base else None, w.base is not None,
        )):
            column.append(value)
        for e in w.entries:
            for column, value in zip(columns[7:13], (cid, e.seq, e.hash, e.role, _text(e.message), e.tokens)):
                column.append(value)
        for p in sorted(w.pages, key=lambda page: page.first_seq):
            for column, value in zip(columns[13:22], (cid, p.number, p.first_seq, p.last_seq, p.state, p.tokens,
                                                      escape(p.summary), p.recall_count, p.last_recalled_turn)):
                column.append(value)
        for chain_hash, length in w.fingerprints:
            for column, value in zip(columns[22:26], (w.tenant, chain_hash, cid, length)):
                column.append(value)
        for after, ordinal, message in w.hidden:
            for column, value in zip(columns[26:30], (cid, after, ordinal, _text(message))):
                column.append(value)
        if w.contents is not None:
            for column, value in zip(columns[30:33], (cid, w.contents[0], escape(w.contents[1]))):
                column.append(value)
        for ev in w.events:
            for column, value in zip(columns[33:37], (ev.tenant, cid, ev.kind, _text(ev.payload))):
                column.append(value)
    return columns


async def create_conversation(connection: Any, tenant: str, conversation_id: str, session_key: str | None,
                              end_user: str = "") -> bool:
    """A new conversation (not a fork) in one statement; False when the id or the session key exists already."""
    return await connection.fetchval(CREATE, conversation_id, tenant, session_key, end_user or None) is not None


async def save_turns(connection: Any, writes: list[TurnWrite]) -> list[str]:
    """``connection``: an asyncpg connection. One outcome per write (see ConversationRepository.save_turns); at
    most one write per conversation."""
    applied = {row[0] for row in await connection.fetch(SAVE_TURNS, *arguments(writes),
                                                        any(w.index_behind for w in writes))}
    if len(applied) == len(writes):
        return [SAVED] * len(writes)
    rest = [w for w in writes if w.conversation_id not in applied]
    current = {
        (row["id"], row["tenant"]): (row["state_version"], row["digest"])
        for row in await connection.fetch(CURRENT, [w.conversation_id for w in rest])
    }
    outcomes = []
    for w in writes:
        if w.conversation_id in applied:
            outcomes.append(SAVED)
            continue
        stored = current.get((w.conversation_id, w.tenant))
        if stored is None:
            outcomes.append(NOT_FOUND)
        elif stored[0] == w.version and stored[1] == snapshot_digest(w.snapshot):
            outcomes.append(REPLAYED)  # its rows were stored with it, in the same statement
        elif w.base is not None and (stored[0] < w.base.version or (stored[0], stored[1]) == (w.base.version,
                                                                                          w.base.digest)):
            # older than the base; or the base itself, stored by another writer between the two statements
            outcomes.append(BEHIND)
        else:
            outcomes.append(STALE)
    return outcomes
