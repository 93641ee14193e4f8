"""Who owns which image bytes, and erasing a conversation with everything only it referenced.

Image bytes are stored once per sha256 in the blob store (any tenant sending the same bytes shares the object);
``blob_refs`` records which conversation of which tenant sent them. Reads are checked against it: a tenant may
read stored bytes only while one of its own conversations references them.

Claiming and deleting serialise on a transaction-scoped advisory lock per image key, so a conversation being
erased can never delete bytes that another conversation claims at the same moment:

- claim:  lock(key) -> insert the reference -> commit -> write the bytes (a no-op when they are there);
- erase:  the conversation's rows go in one transaction; then per key: lock(key) -> still referenced by the
  tenant? by anyone? -> delete the tenant's description / the bytes while the lock is held -> commit.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import ARRAY, Text, bindparam, delete, exists, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from memci_proxy.store.sql.models import BlobRef, Conversation, Event, MemoryVector
from memci_proxy.store.sql.response_chains import delete_conversation_chains
from memci_proxy.wire import logtext

log = logging.getLogger("memci.store")

refs_t = BlobRef.__table__
conv = Conversation.__table__
events_t = Event.__table__
vectors_t = MemoryVector.__table__

_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))")

# What erasing does with one image key once no reference of the tenant (or of anyone) is left.
DeleteObject = Callable[[str, str, bool], Awaitable[None]]  # (tenant, key, bytes too) -> None


@dataclass
class ErasedConversation:
    deleted: bool
    page_vectors: int = 0
    blob_keys: list[str] = field(default_factory=list)  # keys the conversation referenced
    descriptions_deleted: list[str] = field(default_factory=list)  # no other conversation of the tenant has them
    blobs_deleted: list[str] = field(default_factory=list)  # no conversation of anyone has them
    blobs_failed: list[str] = field(default_factory=list)  # the blob store refused; left as orphans (unreadable)
    response_ids: list[str] = field(default_factory=list)  # its stored Responses answers (previous_response_id)


async def _lock(connection: AsyncConnection, key: str) -> None:
    await connection.execute(_LOCK, {"name": "memci-blob:" + key})


class SqlBlobOwnership:
    """Implements memci_proxy.store.ports.BlobOwnership over PostgreSQL."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def claim_blobs(
        self, tenant: str, conversation_id: str, keys: Iterable[str], write: Callable[[], Awaitable[object]]
    ) -> None:
        """Record that the conversation sent these images, then ``write()`` their bytes."""
        wanted = sorted(set(keys))
        if wanted:
            async with self.engine.begin() as connection:
                for key in wanted:  # sorted: two claimers never wait on each other in a cycle
                    await _lock(connection, key)
                await connection.execute(
                    insert(refs_t)
                    .from_select(
                        ["conversation_id", "key", "tenant"],
                        select(conv.c.id, func.unnest(bindparam("keys", wanted, type_=ARRAY(Text))), conv.c.tenant)
                        .where(conv.c.id == conversation_id, conv.c.tenant == tenant),
                    )
                    .on_conflict_do_nothing()
                )
        await write()

    async def owns_blob(self, tenant: str, key: str) -> bool:
        stmt = select(exists().where(refs_t.c.tenant == tenant, refs_t.c.key == key))
        async with self.engine.connect() as connection:
            return bool((await connection.execute(stmt)).scalar())

    async def blob_keys(self, tenant: str, conversation_id: str) -> list[str]:
        stmt = select(refs_t.c.key).where(refs_t.c.conversation_id == conversation_id, refs_t.c.tenant == tenant)
        async with self.engine.connect() as connection:
            return sorted(r.key for r in (await connection.execute(stmt)).all())

    async def delete_page_vectors(self, tenant: str, conversation_id: str) -> int:
        """Every page vector of the conversation (all embedding models); returns how many were deleted."""
        async with self.engine.begin() as connection:
            return await self._delete_page_vectors(connection, tenant, conversation_id)

    @staticmethod
    async def _delete_page_vectors(connection: AsyncConnection, tenant: str, conversation_id: str) -> int:
        owned = exists().where(conv.c.id == conversation_id, conv.c.tenant == tenant)
        result = await connection.execute(
            delete(vectors_t).where(vectors_t.c.conversation_id == conversation_id, owned)
        )
        return int(result.rowcount or 0)

    async def erase_conversation(
        self, tenant: str, conversation_id: str, delete_object: DeleteObject | None = None
    ) -> ErasedConversation:
        """Delete the conversation (entries, pages, vectors, summaries, facts, events, blob references, stored
        Responses answers) and then, per image it referenced, the tenant's description when no other conversation
        of the tenant references the image, and the bytes when no conversation at all does."""
        async with self.engine.begin() as connection:
            keys = sorted(
                r.key for r in (await connection.execute(
                    select(refs_t.c.key).where(refs_t.c.conversation_id == conversation_id, refs_t.c.tenant == tenant)
                )).all()
            )
            vectors = await self._delete_page_vectors(connection, tenant, conversation_id)
            gone = (await connection.execute(
                delete(conv).where(conv.c.id == conversation_id, conv.c.tenant == tenant).returning(conv.c.id)
            )).first()
            if gone is None:
                return ErasedConversation(False)
            responses = await delete_conversation_chains(connection, tenant, conversation_id)
            await connection.execute(
                delete(events_t).where(events_t.c.conversation_id == conversation_id, events_t.c.tenant == tenant)
            )
        out = ErasedConversation(True, vectors, keys, response_ids=responses)
        for key in keys:
            try:
                async with self.engine.begin() as connection:
                    await _lock(connection, key)
                    tenant_has = (await connection.execute(
                        select(exists().where(refs_t.c.tenant == tenant, refs_t.c.key == key)))).scalar()
                    if tenant_has:
                        continue
                    anyone_has = (await connection.execute(select(exists().where(refs_t.c.key == key)))).scalar()
                    if delete_object is not None:
                        await delete_object(tenant, key, not anyone_has)  # while the lock is held
                    out.descriptions_deleted.append(key)
                    if not anyone_has:
                        out.blobs_deleted.append(key)
            except Exception as exc:  # the conversation is gone; an orphaned object is unreadable, only space
                log.warning("could not delete the stored image %s: %s", logtext.field(key, 12), type(exc).__name__)
                out.blobs_failed.append(key)
        return out
