"""Image ownership on a real PostgreSQL: a tenant reads only bytes it sent; erasing a conversation deletes what
only it referenced, and never what another conversation claims at the same moment."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from memci_proxy.store.ports import BlobOwnership
from memci_proxy.store.sql.blob_queries import SqlBlobOwnership
from memci_proxy.store.sql.repository import SqlConversationRepository

A, B = "tenant-a", "tenant-b"
K1, K2, K3 = ("1" * 64), ("2" * 64), ("3" * 64)


class Objects:
    """What the blob store holds: (tenant or '', key); '' marks the shared bytes."""

    def __init__(self) -> None:
        self.held: set[tuple[str, str]] = set()

    def writer(self, tenant: str, keys: list[str]):
        async def write() -> None:
            for key in keys:
                self.held.add(("", key))
                self.held.add((tenant, key))
        return write

    async def delete(self, tenant: str, key: str, with_bytes: bool) -> None:
        self.held.discard((tenant, key))
        if with_bytes:
            self.held.discard(("", key))


async def _vector(repo: SqlConversationRepository, conversation_id: str) -> None:
    async with repo.engine.begin() as connection:
        await connection.execute(text(
            "INSERT INTO memory_vectors (conversation_id, number, model, dim, embedding) "
            "VALUES (:c, '1', 'm', 2, '[1,0]'::vector), (:c, '2', 'm', 2, '[0,1]'::vector)"), {"c": conversation_id})


async def test_ownership_and_erasure(repo: SqlConversationRepository) -> None:
    owners = SqlBlobOwnership(repo.engine)
    assert isinstance(owners, BlobOwnership)
    objects = Objects()
    for tenant, conversation in ((A, "a1"), (A, "a2"), (B, "b1")):
        await repo.create_conversation(tenant, conversation)
    await owners.claim_blobs(A, "a1", [K1, K2], objects.writer(A, [K1, K2]))
    await owners.claim_blobs(A, "a2", [K2], objects.writer(A, [K2]))
    await owners.claim_blobs(B, "b1", [K1], objects.writer(B, [K1]))  # the same bytes from another tenant
    await owners.claim_blobs(B, "a1", [K3], objects.writer(B, [K3]))  # B naming A's conversation: no reference
    assert await owners.owns_blob(A, K1) and await owners.owns_blob(A, K2) and not await owners.owns_blob(A, K3)
    assert await owners.owns_blob(B, K1) and not await owners.owns_blob(B, K2) and not await owners.owns_blob(B, K3)
    assert await owners.blob_keys(A, "a1") == [K1, K2] and await owners.blob_keys(B, "a1") == []
    await _vector(repo, "a1")

    assert not (await owners.erase_conversation(B, "a1", objects.delete)).deleted  # not B's to erase
    assert await owners.blob_keys(A, "a1") == [K1, K2]

    erased = await owners.erase_conversation(A, "a1", objects.delete)
    assert erased.deleted and erased.page_vectors == 2 and erased.blob_keys == [K1, K2]
    assert erased.descriptions_deleted == [K1]  # K2: a2 of the same tenant still has it
    assert erased.blobs_deleted == []  # K1: tenant B still has the same bytes
    assert ("", K1) in objects.held and (A, K1) not in objects.held and (B, K1) in objects.held
    assert not await owners.owns_blob(A, K1) and await owners.owns_blob(A, K2)
    assert await repo.load_snapshot(A, "a1") is None

    erased = await owners.erase_conversation(B, "b1", objects.delete)
    assert erased.blobs_deleted == [K1] and ("", K1) not in objects.held
    erased = await owners.erase_conversation(A, "a2", objects.delete)
    assert erased.blobs_deleted == [K2] and objects.held == {("", K3), (B, K3)}


async def test_erasure_never_deletes_bytes_claimed_at_the_same_moment(repo: SqlConversationRepository) -> None:
    """Each erase deletes a key's bytes only while holding that key's lock and seeing no reference: a claim
    racing with it either keeps the bytes from being deleted or writes them again after."""
    owners = SqlBlobOwnership(repo.engine)
    for round_no in range(20):
        objects = Objects()
        old, new = f"old{round_no}", f"new{round_no}"
        await repo.create_conversation(A, old)
        await repo.create_conversation(A, new)
        await owners.claim_blobs(A, old, [K1], objects.writer(A, [K1]))
        await asyncio.gather(owners.erase_conversation(A, old, objects.delete),
                             owners.claim_blobs(A, new, [K1], objects.writer(A, [K1])))
        assert ("", K1) in objects.held, round_no
        assert await owners.owns_blob(A, K1)
        await owners.erase_conversation(A, new, objects.delete)
