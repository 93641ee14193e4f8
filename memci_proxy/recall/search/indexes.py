"""A conversation's search indexes (BM25, grown as pages are archived) and where page bodies come from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.engine import ACTIVE, ConversationState, PageRecord
from memci_proxy.engine.state import HASH_SIZE, common_prefix_of_records
from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.reading.pagetext import index_terms, user_text, vector_text
from memci_proxy.recall.vectors.index import text_digest
from memci_proxy.store.ports import ConversationRepository

__all__ = ["RecallContext", "PageSource", "SearchIndexes", "INDEX_BYTES_PER_CHAR"]


@dataclass
class RecallContext:
    tenant: str
    conversation_id: str
    state: ConversationState
    messages: list[dict[str, Any]] | None = None  # the request's non-system messages (bodies of known entries)
    image_descriptions: Mapping[str, str] | None = None  # image key -> description (memci_proxy.vision)
    end_user: str = ""  # the end user's key: recall also reads and searches their other conversations


class PageSource:
    """Message bodies of a page: from the request when it carries them, else from the store."""

    def __init__(self, repo: ConversationRepository) -> None:
        self.repo = repo

    async def messages(self, ctx: RecallContext, start: int, end: int) -> list[dict[str, Any]]:
        if ctx.messages is not None and end <= len(ctx.messages):
            return ctx.messages[start:end]
        rows = await self.repo.load_entries(ctx.tenant, ctx.conversation_id, start, end - 1)
        return [r.message for r in rows]


def entry_digests(state: ConversationState, record: PageRecord) -> bytes:
    """The digests of the entries a page covers: the same bytes, the same messages."""
    return state.hash_blob[record.start * HASH_SIZE:record.end * HASH_SIZE]


# Memory of a BM25 index per indexed character (measured with tracemalloc: 9 to 21 bytes, by vocabulary size).
INDEX_BYTES_PER_CHAR = 16


class _Indexed:
    """A conversation's index, the start entry of each page indexed, the characters indexed, and the page records
    it was last brought up to date with (the same records again: nothing to look at, page by page)."""

    __slots__ = ("index", "starts", "chars", "digests", "user_digests", "seen", "offloads", "prepared")

    def __init__(self) -> None:
        self.index = BM25Index()
        self.starts: dict[str, int] = {}
        self.chars: dict[str, int] = {}
        self.digests: dict[str, str] = {}  # page label -> digest of the text its vector is computed from
        self.user_digests: dict[str, str] = {}  # page label -> digest of its user words (pages with some)
        self.seen: list[PageRecord] = []
        self.offloads: set[str] = set()  # labels of the offloaded outputs indexed (pages of their own)
        self.prepared: dict[str, _PreparedPage] = {}  # active pages whose terms were read behind an answer

    def approximate_bytes(self) -> int:
        prepared = sum(len(p.vector_source) for p in self.prepared.values())
        return 1024 + INDEX_BYTES_PER_CHAR * (sum(self.chars.values()) + prepared)


class _PreparedPage:
    """What indexing a page reads from its messages, read while the page was still active (behind an answer), with
    the digests of its entries: the page archived later with the same entries is indexed from it without reading
    its messages again, on the turn that archives it."""

    __slots__ = ("entries", "terms", "vector_source", "users")

    def __init__(self, entries: bytes, terms: list[str], vector_source: str, users: str) -> None:
        self.entries = entries
        self.terms = terms
        self.vector_source = vector_source
        self.users = users


def _text_only(messages: list[dict[str, Any]]) -> bool:
    """Messages whose index text cannot change later (an image's description may arrive after the page closes)."""
    return all(isinstance(m.get("content"), (str, type(None))) for m in messages)


class SearchIndexes:
    """One BM25 index per conversation, grown as pages are archived; an LRU bounded in conversations and in
    (estimated) bytes. An index dropped from it is rebuilt from the store when next searched."""

    def __init__(self, source: PageSource, capacity: int = 256, max_bytes: int = 128 * 2**20,
                 user_weight: int = 1) -> None:
        self.source = source
        self.capacity = capacity
        self.user_weight = user_weight
        self._indexes: BoundedLru[str, _Indexed] = BoundedLru(
            "search_indexes", capacity, max_bytes, size_of=lambda _k, v: v.approximate_bytes())

    async def index_for(self, ctx: RecallContext, added: dict[str, str] | None = None) -> BM25Index:
        """The conversation's index, brought up to date; ``added`` receives page label -> text of the pages
        (re)indexed by this call (the vector half embeds them)."""
        return (await self.entry_for(ctx, added)).index

    def digests(self, conversation_id: str) -> dict[str, str]:
        """Page label -> digest of its vector text, for the pages indexed (empty when the index was dropped)."""
        entry = self._indexes.peek(conversation_id)
        return entry.digests if entry is not None else {}

    def user_digests(self, conversation_id: str) -> dict[str, str]:
        """Page label -> digest of its user words (memci_proxy.recall.reading.pagetext.user_text), for the indexed pages
        with some."""
        entry = self._indexes.peek(conversation_id)
        return entry.user_digests if entry is not None else {}

    async def entry_for(self, ctx: RecallContext, added: dict[str, str] | None = None) -> _Indexed:
        entry = self._indexes.get(ctx.conversation_id)
        if entry is None:
            entry = _Indexed()
            self._indexes.put(ctx.conversation_id, entry)
        elif entry.seen == ctx.state.pages and len(entry.offloads) == len(ctx.state.offloads):
            return entry  # one comparison in C instead of a Python pass over every page
        grew = False
        # the records as they were last time (the same page ranges and states: nothing to index) are passed over in C;
        # the Python pass starts at the first record that changed (a page archived, one more page)
        for record in ctx.state.pages[common_prefix_of_records(entry.seen, ctx.state.pages):]:
            if record.status == ACTIVE:
                continue
            if entry.starts.get(record.label) == record.start:
                continue
            prepared = entry.prepared.pop(record.label, None)
            if prepared is not None and prepared.entries == entry_digests(ctx.state, record):
                terms, vector_source, users = prepared.terms, prepared.vector_source, prepared.users
            else:
                terms, vector_source, users = await self._read_page(ctx, record)
            if record.label in entry.starts:
                entry.index.remove(record.label)
            entry.index.add_terms(record.label, terms)
            entry.starts[record.label] = record.start
            entry.chars[record.label] = len(vector_source)
            entry.digests[record.label] = text_digest(vector_source)
            if users:
                entry.user_digests[record.label] = text_digest(users)
            else:
                entry.user_digests.pop(record.label, None)
            grew = True
            if added is not None:
                added[record.label] = vector_source
        entry.seen = list(ctx.state.pages)
        grew = await self._index_offloads(ctx, entry) or grew
        if grew:
            self._indexes.resize(ctx.conversation_id)  # measured again: may evict others (or this one)
        return entry

    async def _read_page(self, ctx: RecallContext, record: PageRecord) -> tuple[list[str], str, str]:
        """(BM25 terms, vector text, user words) of a page. Its own messages: its hidden recall rounds are copies of
        other pages (which are indexed themselves) and would rank this page for what they quote (its excerpts show
        its own messages only)."""
        messages = await self.source.messages(ctx, record.start, record.end)
        return self._page_texts(messages, ctx.image_descriptions)

    def _page_texts(self, messages: list[dict[str, Any]], image_descriptions: Mapping[str, str] | None
                    ) -> tuple[list[str], str, str]:
        return (index_terms(messages, image_descriptions, self.user_weight),
                vector_text(messages, image_descriptions), user_text(messages, image_descriptions))

    def prepare_active(self, ctx: RecallContext) -> int:
        """Behind an answer: read the terms of the active pages that are complete (every page but the newest) from
        the request's messages, so that the turn that archives them (an epoch) adds them to the index without
        reading them on its way upstream. Pages of text only; at most the active pages are held. Returns how many
        pages were read."""
        if ctx.messages is None:
            return 0
        entry = self._indexes.get(ctx.conversation_id)
        if entry is None:
            entry = _Indexed()
            self._indexes.put(ctx.conversation_id, entry)
        pages = ctx.state.pages
        # the active pages only (the archived ones are not looked at: the work does not grow with the history)
        complete = [r for r in pages[ctx.state.first_active_page:-1]
                    if r.status == ACTIVE and r.end <= len(ctx.messages)]
        if len(entry.prepared) > len(complete):
            wanted = {r.label for r in complete}
            for label in [label for label in entry.prepared if label not in wanted]:
                del entry.prepared[label]  # archived and indexed since, or gone with a fork
        read = 0
        for record in complete:
            if record.label in entry.prepared:
                continue  # read already (changed since, by a fork: the epoch sees the digests differ and reads it)
            digests = entry_digests(ctx.state, record)
            if len(digests) != (record.end - record.start) * HASH_SIZE:
                continue  # (a state without its entries' digests: nothing to know the page again by)
            messages = ctx.messages[record.start:record.end]
            if not _text_only(messages):
                continue
            entry.prepared[record.label] = _PreparedPage(digests, *self._page_texts(messages, None))
            read += 1
        if read:
            self._indexes.resize(ctx.conversation_id)
        return read

    async def _index_offloads(self, ctx: RecallContext, entry: _Indexed) -> bool:
        """Offloaded outputs are pages of their own from the turn they arrive on, searched as such (lexically: they
        have no vectors) while the page that holds them may still be active. Whether the index changed."""
        labels = {record.label: record for record in ctx.state.offloads}
        changed = False
        for label in entry.offloads - labels.keys():  # a fork dropped it
            entry.index.remove(label)
            entry.starts.pop(label, None)
            entry.chars.pop(label, None)
            changed = True
        entry.offloads &= labels.keys()
        for label, record in labels.items():
            if label in entry.offloads:
                continue
            messages = await self.source.messages(ctx, record.entry, record.entry + 1)
            entry.index.add_terms(label, index_terms(messages, ctx.image_descriptions, self.user_weight))
            entry.starts[label] = record.entry
            entry.chars[label] = record.chars
            entry.offloads.add(label)
            changed = True
        return changed

    def forget(self, conversation_id: str) -> None:
        self._indexes.pop(conversation_id)
