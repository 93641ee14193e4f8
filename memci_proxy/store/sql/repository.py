"""ConversationRepository over PostgreSQL: SQLAlchemy 2 Core, async, asyncpg driver."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import ARRAY, Text, any_, bindparam, delete, event, exists, func, literal, select, text, update
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from memci_proxy.store.ports import (
    BEHIND,
    NOT_FOUND,
    STALE,
    ConversationConflict,
    ConversationNotFound,
    EntryRow,
    EventRow,
    PageRow,
    SnapshotBase,
    SnapshotBehind,
    StaleState,
    TurnWrite,
)
from memci_proxy.store.sql import batch_writes, pgtext
from memci_proxy.store.sql import turn_statements as turn
from memci_proxy.store.sql.admin_queries import ConversationAdminQueries
from memci_proxy.store.sql.memory_queries import OWNED_SQL, MemoryQueries
from memci_proxy.store.sql.models import BlobRef, Conversation, Entry, Event, Fingerprint, HiddenMessage, Page
from memci_proxy.store.sql.response_chains import delete_conversation_chains
from memci_proxy.store.sql.search_queries import PageSearchQueries, page_row
from memci_proxy.store.sql.urls import to_async_url
from memci_proxy.store.sql.vector_queries import PageVectorQueries
from memci_proxy.store.sql.user_memory_queries import UserMemoryQueries

T = TypeVar("T")

# What a statement on a connection the server dropped (a restart, a failover) raises: a read is tried once more
_LOST = (asyncpg.exceptions.PostgresConnectionError, asyncpg.exceptions.AdminShutdownError,
         asyncpg.exceptions.InterfaceError, ConnectionError)


def _closed_on_checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
    """A pooled connection whose socket the server closed (its driver saw the end of the stream: a restart closes
    every one) is replaced when taken, with every connection older than it, at no round trip."""
    driver = getattr(dbapi_connection, "_connection", None)
    if driver is not None and driver.is_closed():
        raise InvalidatePoolError("the server closed the connection")


def create_engine_from_url(url: str, pool_size: int = 10, max_overflow: int = 20, echo: bool = False,
                           pre_ping: bool = True, fulltext: bool = True) -> AsyncEngine:
    """An asyncpg engine for any PostgreSQL URL form; JSON columns through msgspec, escaped (memci_proxy.store.sql.pgtext)
    where they hold what PostgreSQL cannot store. ``pre_ping``: a connection is pinged before each use (a server
    restarted meanwhile costs no request); without it, a connection the server closed is still replaced when taken
    (``_closed_on_checkout``), and one whose loss went unseen fails its statement. ``fulltext`` off: the pages its
    connections write get no tsvector (``_no_fulltext``; the ``page_fulltext`` setting)."""
    engine = create_async_engine(
        to_async_url(url),
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        echo=echo,
        hide_parameters=True,  # error messages (and so logs) never carry message content or keys
        json_serializer=pgtext.dumps,
        json_deserializer=pgtext.loads,
    )
    if not pre_ping:
        event.listen(engine.sync_engine, "checkout", _closed_on_checkout)
    if not fulltext:
        event.listen(engine.sync_engine, "connect", _no_fulltext)
    return engine


def _no_fulltext(dbapi_connection: Any, _record: Any) -> None:
    """A new connection's session leaves pages without a tsvector: the pages_tsv trigger reads this setting (migration
    0010) and keeps tsv NULL, for every write of the session (through a transaction pooler that drops session
    settings, the trigger computes it as before: only its cost comes back)."""
    # on the driver's connection, outside a transaction (a DBAPI cursor would open one, rolled back on checkin)
    dbapi_connection.run_async(lambda driver: driver.execute("SET memci.index_behind = on"))


conv = Conversation.__table__
entries_t = Entry.__table__
pages_t = Page.__table__
fingerprints_t = Fingerprint.__table__
events_t = Event.__table__

TAIL_WINDOW = 32  # hashes looked up first by find_longest_prefix

_HASHES = bindparam("hashes", type_=ARRAY(Text))
_LONGEST_PREFIX = (
    select(fingerprints_t.c.chain_hash, fingerprints_t.c.conversation_id)
    .where(fingerprints_t.c.tenant == bindparam("tenant"), fingerprints_t.c.chain_hash == any_(_HASHES))
    .order_by(fingerprints_t.c.length.desc())
    .limit(1)
)


_SET_SUMMARIES = text(
    "UPDATE pages SET summary = new.summary "
    "FROM unnest(:numbers, :summaries) AS new(number, summary), conversations c "
    "WHERE pages.conversation_id = :conversation_id AND pages.number = new.number "
    "AND c.id = pages.conversation_id AND c.tenant = :tenant "
    "RETURNING pages.number"
).bindparams(bindparam("numbers", type_=ARRAY(Text)), bindparam("summaries", type_=ARRAY(Text)))


def _owned(conversation_id: str, tenant: str) -> Any:
    """SQL condition: the conversation exists and belongs to the tenant (for child-table queries)."""
    return exists().where(conv.c.id == conversation_id, conv.c.tenant == tenant)


# Reads of every epoch's jobs and of recall, in plain SQL on the driver's connection (memci_proxy.store.sql.memory_queries).
# A page is read as a PageRow holds it: not the tsvector (a page's indexed words, about as large as its text) nor the
# timestamps.
_OWNED_SQL = OWNED_SQL.format(tenant="$4")
_LOAD_ENTRIES = ("SELECT seq, hash, role, message::text AS message, tokens FROM entries WHERE conversation_id = $1 "
                 f"AND seq BETWEEN $2 AND $3 AND {_OWNED_SQL} ORDER BY seq")
_LOAD_PAGES = ("SELECT number, first_seq, last_seq, state, tokens, summary, recall_count, last_recalled_turn FROM pages "
               f"WHERE conversation_id = $1 AND state = ANY($2::text[]) AND first_seq > $3 AND {_OWNED_SQL} "
               "ORDER BY first_seq, number")


class _Fields:
    """An asyncpg record read by attribute, as page_row reads a SQLAlchemy row."""

    __slots__ = ("_record",)

    def __init__(self, record: Any) -> None:
        self._record = record

    def __getattr__(self, name: str) -> Any:
        return self._record[name]


# Setting tsv to NULL makes the pages_tsv trigger compute it (migration 0010; ix_pages_unindexed finds them)
_INDEX_PAGES = ("UPDATE pages SET tsv = NULL WHERE conversation_id = $1 AND number = ANY($2::text[]) AND tsv IS NULL "
                f"AND state <> 'active' AND {OWNED_SQL.format(tenant='$3')}")
_INDEX_LEFT = "UPDATE pages SET tsv = NULL WHERE tsv IS NULL AND state <> 'active'"


def _updated(status: str) -> int:
    """The row count of a command's status ("UPDATE 3")."""
    return int(status.rsplit(" ", 1)[-1]) if status and status[-1].isdigit() else 0


class SqlConversationRepository(ConversationAdminQueries, PageSearchQueries, PageVectorQueries, MemoryQueries,
                                UserMemoryQueries):
    """Implements memci_proxy.store.ports.ConversationRepository, ConversationAdmin and PageVectorStore; full-text
    page search."""

    def __init__(self, engine: AsyncEngine, write_engine: AsyncEngine | None = None,
                 read_engine: AsyncEngine | None = None) -> None:
        self.engine = engine
        # Turns are written on connections that are not pinged first (the writer retries a failed batch).
        self.write_engine = write_engine or engine
        # Reads of one statement, outside a transaction: one round trip (a statement is atomic and sees one
        # snapshot on its own), where a transaction adds a BEGIN and a ROLLBACK; the same pool.
        self.reader = engine.execution_options(isolation_level="AUTOCOMMIT")
        # The reads on the driver's connection: on connections not pinged first (a read on one the server dropped
        # unseen is tried once more)
        self.read_engine = read_engine or self.reader

    # --- conversations ---------------------------------------------------------------------
    async def create_conversation(
        self,
        tenant: str,
        conversation_id: str,
        session_key: str | None = None,
        parent_id: str | None = None,
        forked_at: int | None = None,
        end_user: str = "",
    ) -> None:
        if parent_id is None and await self._created(tenant, conversation_id, session_key, end_user):
            return  # the common case, one statement on the driver's connection
        stmt = (
            insert(conv)
            .values(
                id=conversation_id, tenant=tenant, session_key=session_key, parent_id=parent_id, forked_at=forked_at,
                end_user=end_user or None,
            )
            .on_conflict_do_nothing()
            .returning(conv.c.id)
        )
        async with self.engine.begin() as connection:
            if (await connection.execute(stmt)).first() is not None:
                if parent_id is not None and forked_at:
                    await self._inherit_prefix(connection, tenant, parent_id, conversation_id, forked_at)
                return
            row = (
                await connection.execute(select(conv.c.tenant, conv.c.session_key).where(conv.c.id == conversation_id))
            ).first()
        if row is not None and row.tenant == tenant and row.session_key == session_key:
            return  # created before: idempotent
        if row is not None:
            raise ConversationConflict(f"conversation id {conversation_id!r} is already in use")
        raise ConversationConflict(f"session key {session_key!r} belongs to another conversation")

    async def _created(self, tenant: str, conversation_id: str, session_key: str | None, end_user: str) -> bool:
        return await self._on_driver(
            lambda raw: batch_writes.create_conversation(raw, tenant, conversation_id, session_key, end_user))

    async def _on_driver(self, work: Callable[[Any], Awaitable[T]], engine: AsyncEngine | None = None) -> T:
        """``work`` on the asyncpg connection of a write connection (``engine``: of that engine's pool)."""
        async with (engine or self.write_engine).connect() as connection:
            try:
                return await work((await connection.get_raw_connection()).driver_connection)
            except BaseException:
                await connection.invalidate()  # the driver's own error: the pool cannot tell a broken connection
                raise

    async def _read_on_driver(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``work`` (reads) on the asyncpg connection of a read connection, outside a transaction; the statement
        prepared once per connection (no SQLAlchemy construction and compilation per call). A connection the server
        dropped without its loss being seen fails the read: it is tried once more, on another connection."""
        try:
            return await self._on_driver(work, self.read_engine)
        except _LOST:  # the pool's other connections are of the same server: dropped too (those in use finish)
            await self.read_engine.dispose(close=False)
            return await self._on_driver(work, self.read_engine)

    @staticmethod
    async def _inherit_prefix(
        connection: AsyncConnection, tenant: str, parent_id: str, child_id: str, forked_at: int
    ) -> None:
        """A fork shares its parent's first `forked_at` entries (and their hidden messages): copy them, so that
        every page of the fork reads from the fork alone."""
        hidden_t = HiddenMessage.__table__
        owned = exists().where(conv.c.id == parent_id, conv.c.tenant == tenant)
        await connection.execute(
            insert(entries_t).from_select(
                ["conversation_id", "seq", "hash", "role", "message", "tokens", "created_at"],
                select(literal(child_id), entries_t.c.seq, entries_t.c.hash, entries_t.c.role, entries_t.c.message,
                       entries_t.c.tokens, entries_t.c.created_at)
                .where(entries_t.c.conversation_id == parent_id, entries_t.c.seq < forked_at, owned),
            ).on_conflict_do_nothing()
        )
        await connection.execute(
            insert(hidden_t).from_select(
                ["conversation_id", "after_seq", "ordinal", "message", "created_at"],
                select(literal(child_id), hidden_t.c.after_seq, hidden_t.c.ordinal, hidden_t.c.message,
                       hidden_t.c.created_at)
                .where(hidden_t.c.conversation_id == parent_id, hidden_t.c.after_seq < forked_at, owned),
            ).on_conflict_do_nothing()
        )
        # The copied entries may reference the parent's images: the fork owns them too (deleting the parent must
        # not delete bytes the fork still shows). All of the parent's are taken: a superset never loses any.
        refs_t = BlobRef.__table__
        await connection.execute(
            insert(refs_t).from_select(
                ["conversation_id", "key", "tenant"],
                select(literal(child_id), refs_t.c.key, refs_t.c.tenant)
                .where(refs_t.c.conversation_id == parent_id, refs_t.c.tenant == tenant, owned),
            ).on_conflict_do_nothing()
        )

    async def find_by_session_key(self, tenant: str, session_key: str) -> str | None:
        stmt = select(conv.c.id).where(conv.c.tenant == tenant, conv.c.session_key == session_key)
        async with self.engine.connect() as connection:
            return (await connection.execute(stmt)).scalar_one_or_none()

    async def find_longest_prefix(self, tenant: str, chain_hashes: list[str]) -> tuple[str, int] | None:
        """A continuing conversation matches near the end: the last TAIL_WINDOW hashes are tried
        first (a hit there is the longest match); only a miss asks about the whole list."""
        if not chain_hashes:
            return None
        async with self.engine.connect() as connection:
            row = None
            if len(chain_hashes) > TAIL_WINDOW:
                tail = {"tenant": tenant, "hashes": chain_hashes[-TAIL_WINDOW:]}
                row = (await connection.execute(_LONGEST_PREFIX, tail)).first()
                rest = chain_hashes[:-TAIL_WINDOW]
            else:
                rest = chain_hashes
            if row is None:
                row = (await connection.execute(_LONGEST_PREFIX, {"tenant": tenant, "hashes": rest})).first()
        if row is None:
            return None
        position = len(chain_hashes) - 1 - chain_hashes[::-1].index(row.chain_hash)
        return row.conversation_id, position + 1

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        """Child rows go by ON DELETE CASCADE; events (no foreign key: they may outlive) explicitly."""
        async with self.engine.begin() as connection:
            deleted = (
                await connection.execute(
                    delete(conv).where(conv.c.id == conversation_id, conv.c.tenant == tenant).returning(conv.c.id)
                )
            ).first()
            if deleted is None:
                return False
            await delete_conversation_chains(connection, tenant, conversation_id)
            await connection.execute(
                delete(events_t).where(events_t.c.conversation_id == conversation_id, events_t.c.tenant == tenant)
            )
        return True

    # --- turns ----------------------------------------------------------------------------------
    async def save_turn(
        self,
        tenant: str,
        conversation_id: str,
        entries: list[EntryRow],
        pages: list[PageRow],
        fingerprints: list[tuple[str, int]],
        snapshot: bytes,
        state_version: int,
        events: list[EventRow],
        contents: tuple[int, str] | None = None,
        hidden: Sequence[tuple[int, int, dict[str, Any]]] = (),
        base: SnapshotBase | None = None,
    ) -> None:
        """A replay (same version and snapshot as stored) re-upserts its rows harmlessly and does
        not insert its events twice."""
        write = TurnWrite(tenant, conversation_id, snapshot, state_version, base, list(entries), list(pages),
                          list(fingerprints), list(events), contents, list(hidden))
        outcome = (await self.save_turns([write]))[0]
        if outcome == NOT_FOUND:
            raise ConversationNotFound(conversation_id)
        if outcome == BEHIND:
            raise SnapshotBehind(f"conversation {conversation_id}: the stored state is older than the base "
                                 f"{base.version if base else '-'}")
        if outcome == STALE:
            raise StaleState(f"conversation {conversation_id}: another state is stored than the one version "
                             f"{state_version} was planned from")

    async def save_turns(self, writes: list[TurnWrite]) -> list[str]:
        """One statement (one round trip, one transaction) for the whole batch: memci_save_turns compares and
        sets every snapshot, then writes the rows of those that applied. At most one write per conversation per
        call (several are written one call after the other)."""
        if not writes:
            return []
        if len({w.conversation_id for w in writes}) < len(writes):
            outcomes: list[str] = []
            for w in writes:
                outcomes += await self.save_turns([w])
            return outcomes
        return await self._on_driver(lambda raw: batch_writes.save_turns(raw, writes))

    # --- reads --------------------------------------------------------------------------------
    async def load_snapshot(self, tenant: str, conversation_id: str) -> tuple[bytes, int] | None:
        stmt = select(conv.c.state, conv.c.state_version).where(conv.c.id == conversation_id, conv.c.tenant == tenant)
        async with self.reader.connect() as connection:
            row = (await connection.execute(stmt)).first()
        if row is None or row.state is None:
            return None
        return bytes(row.state), row.state_version

    async def load_entries(self, tenant: str, conversation_id: str, first_seq: int, last_seq: int) -> list[EntryRow]:
        rows = await self._read_on_driver(
            lambda raw: raw.fetch(_LOAD_ENTRIES, conversation_id, first_seq, last_seq, tenant))
        return [EntryRow(seq=r["seq"], hash=r["hash"], role=r["role"], message=pgtext.loads(r["message"]),
                         tokens=r["tokens"]) for r in rows]

    async def load_pages(
        self, tenant: str, conversation_id: str, states: tuple[str, ...] = ("archived", "evicted"),
        after_seq: int | None = None,
    ) -> list[PageRow]:
        rows = await self._read_on_driver(lambda raw: raw.fetch(
            _LOAD_PAGES, conversation_id, list(states), -1 if after_seq is None else after_seq, tenant))
        return [page_row(_Fields(r)) for r in rows]

    # --- small writes outside a turn ------------------------------------------------------------
    async def index_pages(self, tenant: str, conversation_id: str, numbers: Sequence[str]) -> int:
        """The full-text index of the conversation's pages ``numbers`` that were stored without it (``index_behind``):
        the pages_tsv trigger computes it. How many pages it indexed."""
        return _updated(await self._on_driver(
            lambda raw: raw.execute(_INDEX_PAGES, conversation_id, list(numbers), tenant)))

    async def index_left_pages(self) -> int:
        """Every non-active page still without its full-text index (a process stopped before making it)."""
        return _updated(await self._on_driver(lambda raw: raw.execute(_INDEX_LEFT)))

    async def update_recall_stats(self, tenant: str, conversation_id: str, numbers: list[str], turn: int) -> None:
        if not numbers:
            return
        stmt = (
            update(pages_t)
            .where(
                pages_t.c.conversation_id == conversation_id,
                pages_t.c.number.in_(list(numbers)),
                _owned(conversation_id, tenant),
            )
            .values(
                recall_count=pages_t.c.recall_count + 1,
                last_recalled_turn=func.greatest(pages_t.c.last_recalled_turn, turn),
            )
        )
        async with self.engine.begin() as connection:
            await connection.execute(stmt)

    async def set_page_summaries(self, tenant: str, conversation_id: str, summaries: dict[str, str]) -> int:
        """Replace the summaries of some pages (background summary jobs); returns pages updated."""
        if not summaries:
            return 0
        async with self.engine.begin() as connection:
            result = await connection.execute(
                _SET_SUMMARIES,
                {
                    "tenant": tenant,
                    "conversation_id": conversation_id,
                    "numbers": list(summaries),
                    "summaries": [pgtext.escape(summary) for summary in summaries.values()],
                },
            )
            return len(result.all())

    async def append_events(self, events: list[EventRow]) -> None:
        """Record events outside a turn (background jobs, e.g. archive_backlog)."""
        if events:
            async with self.engine.begin() as connection:
                await connection.execute(turn.INSERT_EVENTS, turn.event_params(events))

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as connection:
                return (await connection.execute(select(literal(1)))).scalar_one() == 1
        except Exception:  # noqa: BLE001 - any failure means "not reachable"
            return False

    async def close(self) -> None:
        await self.engine.dispose()
