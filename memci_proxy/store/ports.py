"""What the rest of the proxy needs from storage, independent of the technology behind it.

Two ports:
- ConversationRepository: the durable store of truth (PostgreSQL in production). Every lookup is
  scoped by tenant: a conversation of another tenant is invisible (reads return nothing, writes
  raise ConversationNotFound).
- HotState: the fast, shared, disposable layer (Redis, or in-process for one replica): the
  conversation's latest snapshot, a fingerprint cache, and the per-conversation session lock.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

PAGE_STATES = ("active", "archived", "evicted")


@dataclass
class EntryRow:
    """One message of a conversation (immutable once stored)."""

    seq: int
    hash: str
    role: str
    message: dict[str, Any]
    tokens: int


@dataclass
class PageRow:
    """A page: a range of entries and where it is (active / archived / evicted)."""

    number: str  # "12", or "12.2" for a continuation page
    first_seq: int
    last_seq: int
    state: str
    tokens: int
    summary: str
    recall_count: int = 0
    last_recalled_turn: int | None = None


@dataclass
class EventRow:
    tenant: str
    conversation_id: str | None
    kind: str
    payload: dict[str, Any]


def snapshot_digest(snapshot: bytes) -> str:
    """md5 hex of a snapshot's bytes, as PostgreSQL's md5(state) computes it: the identity of a stored state in
    a SnapshotBase (not a security measure)."""
    return hashlib.md5(snapshot, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class SnapshotBase:
    """The stored state a new snapshot was planned from: its version and the md5 of its bytes (None: no state
    stored yet). A save with a base applies only while exactly that state is stored (compare and set)."""

    version: int
    digest: str | None


@dataclass
class TurnWrite:
    """One conversation's rows and newest snapshot, written in one go (see ConversationRepository.save_turns)."""

    tenant: str
    conversation_id: str
    snapshot: bytes
    version: int
    base: SnapshotBase | None = None
    entries: list[EntryRow] = field(default_factory=list)
    pages: list[PageRow] = field(default_factory=list)
    fingerprints: list[tuple[str, int]] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    contents: tuple[int, str] | None = None
    hidden: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    # its pages leaving 'active' are stored without their full-text index, made after the answer (index_pages)
    index_behind: bool = False


# Outcomes of one TurnWrite in save_turns.
SAVED, REPLAYED, STALE, BEHIND, NOT_FOUND = "saved", "replayed", "stale", "behind", "not_found"


@dataclass
class ConversationInfo:
    """What the admin API shows of a conversation (no message content)."""

    id: str
    tenant: str
    session_key: str | None
    parent_id: str | None
    forked_at: int | None
    label: str | None
    state_version: int
    created_at: datetime
    updated_at: datetime
    last_active_at: datetime
    entries: int = 0
    pages: int = 0


@dataclass(frozen=True, slots=True)
class UserPageText:
    """A page of one of an end user's conversations, as their memory across conversations holds it."""

    conversation_id: str
    number: str
    seen_at: float  # when the page was first seen (epoch seconds)
    text: str  # its messages as role-labelled text (memci_proxy.recall.reading.pagetext.index_text)


@dataclass(frozen=True, slots=True)
class UserPageStats:
    """What ranking a candidate page of an end user's memory needs: its length in terms and the counts of the
    query's terms in it (its text is read for the hits alone)."""

    conversation_id: str
    number: str
    seen_at: float
    length: int
    counts: dict[str, int]


@dataclass(frozen=True, slots=True)
class UserPageRow:
    """A page written to the end user's index (memci_proxy.store.sql.user_memory_queries)."""

    number: str
    first_seq: int
    last_seq: int
    seen_at: float  # epoch seconds
    text: str
    terms: list[str]  # its terms, tagged with the user's key (memci_proxy.recall.users.across.tagged_terms)
    counts: dict[str, int]  # its BM25 terms' counts (memci_proxy.recall.users.across.page_counts)
    length: int  # their sum


@dataclass
class StoredEvent(EventRow):
    id: int = 0
    created_at: datetime | None = None


class StoreError(Exception):
    """Base of the storage errors callers may want to handle."""


class ConversationNotFound(StoreError, KeyError):
    """No conversation of that id for that tenant."""


class ConversationConflict(StoreError):
    """The id is taken by another tenant, or the session key by another conversation."""


class StaleState(StoreError):
    """The stored state is not the one the snapshot was planned from: another writer got there first (a newer
    version, or the same version with other content)."""


class SnapshotBehind(StaleState):
    """The stored state is older than the one the snapshot was planned from: the write this one builds on (another
    replica's, or one lost in a crash) has not landed."""


class LockTimeout(StoreError, TimeoutError):
    """The session lock could not be taken within the wait allowed."""


@runtime_checkable
class ConversationRepository(Protocol):
    async def create_conversation(
        self,
        tenant: str,
        conversation_id: str,
        session_key: str | None = None,
        parent_id: str | None = None,
        forked_at: int | None = None,
        end_user: str = "",
    ) -> None:
        """Create it, for ``end_user`` (a keyed hash; "" for none); a no-op when it exists for this tenant with the
        same session key.
        Raises ConversationConflict when the id belongs to another tenant or the session key to
        another conversation (look it up again with find_by_session_key)."""

    async def find_by_session_key(self, tenant: str, session_key: str) -> str | None: ...

    async def find_longest_prefix(self, tenant: str, chain_hashes: list[str]) -> tuple[str, int] | None:
        """chain_hashes[i] identifies messages[0..i]. Returns (conversation_id, i + 1) for the
        largest i whose hash is known for this tenant, or None."""

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
        hidden: list[tuple[int, int, dict[str, Any]]] = (),  # type: ignore[assignment]
    ) -> None:
        """Persist one turn in ONE transaction; idempotent (saving the same turn twice is harmless).
        fingerprints: (chain_hash, length); contents: (epoch, text); hidden: (after_seq, ordinal, message).
        Raises ConversationNotFound, or StaleState unless the stored version is older (a stored state of the same
        version with other content is a conflict too, never overwritten)."""

    async def save_turns(self, writes: list[TurnWrite]) -> list[str]:
        """Persist several conversations' turns in ONE transaction; one outcome per write, in order:
        SAVED; REPLAYED (this snapshot and version were stored already: rows upserted again, events not twice);
        STALE (another state is stored: newer, or the same version with other content; nothing written);
        BEHIND (with a base: the stored version is older than the base; nothing written); NOT_FOUND.
        With a base, a write applies only while the stored state is exactly the base (version and md5 of its
        bytes); without one, only while the stored version is older."""

    async def load_snapshot(self, tenant: str, conversation_id: str) -> tuple[bytes, int] | None: ...

    async def load_entries(
        self, tenant: str, conversation_id: str, first_seq: int, last_seq: int
    ) -> list[EntryRow]:
        """Entries with first_seq <= seq <= last_seq, in order."""

    async def load_pages(
        self, tenant: str, conversation_id: str, states: tuple[str, ...] = ("archived", "evicted"),
        after_seq: int | None = None,
    ) -> list[PageRow]:
        """Pages in those states (starting after ``after_seq``, when given), ordered by first_seq."""

    async def update_recall_stats(self, tenant: str, conversation_id: str, numbers: list[str], turn: int) -> None:
        """recall_count += 1 and last_recalled_turn = turn for each page listed."""

    async def index_pages(self, tenant: str, conversation_id: str, numbers: Sequence[str]) -> int:
        """The full-text index of those pages that a write with ``index_behind`` stored without it; how many."""

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        """Remove every row of the conversation (events included); False when there was none."""

    async def ping(self) -> bool: ...


@runtime_checkable
class PageVectorStore(Protocol):
    """Page embeddings (pgvector), scoped by tenant like the repository."""

    async def put_page_vectors(
        self, tenant: str, conversation_id: str, model: str, vectors: Sequence[tuple[str, str, Sequence[float]]]
    ) -> int:
        """Upsert (page number, digest of the embedded text, vector); returns rows written."""

    async def page_vector_digests(self, tenant: str, conversation_id: str, model: str) -> dict[str, str]:
        """Page number -> digest of the text whose vector is stored for ``model``."""

    async def nearest_pages(
        self, tenant: str, conversation_id: str, model: str, query: Sequence[float], k: int = 10, exact: bool = True
    ) -> list[tuple[str, float]]:
        """(page number, cosine similarity) of the k nearest pages of the conversation, best first."""

    async def ensure_vector_index(self, dim: int) -> str:
        """Create the HNSW index for vectors of this dimension when missing; returns its name."""


@runtime_checkable
class HotState(Protocol):
    async def get_snapshot(self, conversation_id: str, newer_than: int = -1) -> tuple[bytes, int] | None:
        """(snapshot, version), or None when there is none of a version above ``newer_than``."""

    async def put_snapshot(self, conversation_id: str, snapshot: bytes, version: int, ttl_s: float) -> None:
        """Store it unless a newer version is there already."""

    async def get_fingerprint(self, tenant: str, chain_hash: str) -> tuple[str, int] | None:
        """(conversation_id, length) cached for this tenant's chain hash."""

    async def put_fingerprints(self, tenant: str, items: list[tuple[str, str, int]], ttl_s: float) -> None:
        """items: (chain_hash, conversation_id, length)."""

    def lock(
        self, conversation_id: str, timeout_s: float = 30.0, lease_s: float = 60.0
    ) -> AbstractAsyncContextManager[None]:
        """The conversation's session lock. Waits at most timeout_s (then LockTimeout); the lease
        is renewed while held and expires lease_s after a holder dies."""

    async def delete_conversation(self, conversation_id: str) -> None:
        """Forget the snapshot and the fingerprints pointing at it (not a held lock)."""

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...


@runtime_checkable
class ConversationAdmin(Protocol):
    """Reads and small edits for the admin API (all scoped by tenant)."""

    async def list_conversations(
        self, tenant: str, limit: int = 50, before: datetime | None = None
    ) -> list[ConversationInfo]:
        """Most recently active first; ``before``: only those last active before it (paging)."""

    async def get_conversation(self, tenant: str, conversation_id: str) -> ConversationInfo | None: ...

    async def set_label(self, tenant: str, conversation_id: str, label: str | None) -> bool: ...

    async def load_events(
        self, tenant: str, conversation_id: str | None = None, kinds: tuple[str, ...] = (), limit: int = 100
    ) -> list[StoredEvent]:
        """Newest first."""


@runtime_checkable
class BlobOwnership(Protocol):
    """Which tenant's conversations sent which image bytes (memci_proxy.store.sql.blob_queries)."""

    async def claim_blobs(self, tenant: str, conversation_id: str, keys: Any, write: Any) -> None:
        """Record the references, then call ``write()`` to store the bytes (serialised against erasure)."""

    async def owns_blob(self, tenant: str, key: str) -> bool:
        """Whether one of the tenant's conversations references the image with this sha256."""

    async def delete_page_vectors(self, tenant: str, conversation_id: str) -> int: ...

    async def erase_conversation(self, tenant: str, conversation_id: str, delete_object: Any = None) -> Any:
        """Delete the conversation and what only it referenced (returns a blob_queries.ErasedConversation)."""


@runtime_checkable
class ResponseChains(Protocol):
    """The messages behind each stored answer of an API that chains answers by id (Responses'
    ``previous_response_id``), so that a client may send only what is new (memci_proxy.store.sql.response_chains)."""

    async def put_response(self, tenant: str, response_id: str, previous_id: str | None,
                           messages: list[dict[str, Any]], conversation_id: str | None = None) -> None:
        """Store one answer: the messages it added to the chain (the request's new ones and the answer's own),
        tied to its conversation (erasing the conversation erases the answer)."""

    async def load_chain(self, tenant: str, response_id: str) -> list[dict[str, Any]] | None:
        """Every message of the chain ending at ``response_id``, oldest first; None when the tenant has none such."""

    async def load_links(self, tenant: str, response_id: str) -> list[tuple[str, list[dict[str, Any]]]] | None:
        """The chain ending at ``response_id`` as (answer id, the messages it added), oldest first."""

    async def all_present(self, tenant: str, response_ids: Any) -> bool:
        """Whether every answer named is still stored (none was erased with its conversation)."""
