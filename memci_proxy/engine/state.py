"""The compact, serialisable state of one conversation (no message bodies except hidden messages)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

import msgspec

from .learner import CountFit
from .output_preview import OffloadRecord

HASH_SIZE = 16
STATE_VERSION = 2
ACTIVE = 0
ARCHIVED = 1
EVICTED = 2
STATUS_NAMES = {ACTIVE: "active", ARCHIVED: "archived", EVICTED: "evicted"}
# The one vocabulary of page states: the database, the conversations and search APIs, the X-Memci-Pages-* headers,
# `inspect` and docs/memory.md#page-states (tests/unit/test_page_states.py holds them together). A page's state is
# the most specific one; counts of archived pages include the evicted ones (every page out of the prompt).
STATUS_MEANINGS = {
    "active": "in the prompt, verbatim",
    "archived": "out of the prompt, listed on the contents page (recall by its number, or by a search)",
    "evicted": "archived, then dropped from the contents page (recall's search still finds it, as does its number)",
}


class PageRecord(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A view over entries [start, end): page `number`, continuation `part` (1 = the page itself)."""

    number: int
    part: int
    start: int
    end: int
    tokens: int  # current rendered tokens of its entries and hidden messages (raw estimate)
    status: int = ACTIVE
    has_user: bool = False
    first_seen: float = 0.0
    archived_turn: int = -1
    recall_count: int = 0
    last_recalled_turn: int = -1
    contents: str = ""  # contents-page body lines while archived
    contents_tokens: int = 0

    @property
    def label(self) -> str:
        return str(self.number) if self.part == 1 else f"{self.number}.{self.part}"


class HiddenGroup(msgspec.Struct, array_like=True, frozen=True):
    """Messages the client never sent (e.g. a resolved recall exchange), rendered after entry `after`."""

    after: int
    messages: list[dict[str, Any]]
    tokens: int
    condensed: bool = False
    added_turn: int = 0  # the state's turn when it was added (new since the last plan when == that turn)
    # The volatile blocks entry `after` (a user message) carried when the first group after it was added: that
    # entry keeps them byte for byte from then on, so the prefix the hidden messages follow never changes.
    volatile: str = ""


class ConversationState(msgspec.Struct, kw_only=True):
    version: int = STATE_VERSION
    hash_blob: bytes = b""  # entry hashes: HASH_SIZE bytes (xxh3_128 digest) per entry, in order
    tokens: list[int] = msgspec.field(default_factory=list)  # per entry, as currently rendered
    pages: list[PageRecord] = msgspec.field(default_factory=list)
    first_active_page: int = 0  # index into `pages`; pages from here on are active
    condensed: list[int] = msgspec.field(default_factory=list)  # sorted entry indices rendered condensed
    # Image key -> description an active condensed entry's image decayed to at an epoch ("" = the placeholder):
    # frozen so that a description arriving later does not change text already sent upstream.
    image_texts: dict[str, str] = msgspec.field(default_factory=dict)
    hidden: list[HiddenGroup] = msgspec.field(default_factory=list)  # sorted by `after`
    # Outputs offloaded on arrival (memci_proxy.engine.output_preview), in entry order: each its own page, shown by a preview.
    offloads: list[OffloadRecord] = msgspec.field(default_factory=list)
    next_page: int = 1
    # System message of the current epoch: B1 digest, B2a profile, B4 summary and contents page.
    b1_digest: str = ""
    b1_tokens: int = -1  # tokens of B1 alone (-1: not counted yet): with the tools, the client's fixed part
    profile: str = ""
    summary: str = ""
    contents_text: str = ""
    system_text: str | None = None
    system_tokens: int = 0
    active_tokens: int = 0
    epoch: int = 0
    turn: int = 0
    correction_ratio: float = 1.0
    counts: CountFit | None = None  # the token costs learned from this conversation's answers (memci_proxy.engine.learner)
    # The previous request, to skip re-hashing and to measure the stable prefix.
    messages_kind: str = ""  # "raw" (the client's bytes) or "encoded" (re-encoded by the engine)
    messages_length: int = 0  # end of the last message in that array
    messages_digest: str = ""
    last_upstream_count: int = 0
    last_volatile_entry: int = -1  # latest user message of the last request, if it was active
    last_volatile_text: str = ""  # volatile blocks placed in that entry ("" when none)
    last_turn_time: float | None = None
    expected_cached_tokens: int = 0  # estimated stable prefix of the last request (raw estimate)
    last_cached_tokens: int | None = None

    def to_bytes(self) -> bytes:
        return _ENCODER.encode(self)

    @classmethod
    def from_bytes(cls, data: bytes) -> "ConversationState":
        """Decode a state; ValueError when the bytes are not a state of this version (rebuild it then)."""
        try:
            state = _DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise ValueError(f"not a conversation state: {exc}") from None
        if state.version != STATE_VERSION or len(state.hash_blob) != HASH_SIZE * len(state.tokens):
            raise ValueError("conversation state of another version")
        return state

    def copy(self) -> "ConversationState":
        """A copy whose lists may be changed without touching this state (records are immutable)."""
        return msgspec.structs.replace(
            self,
            tokens=list(self.tokens),
            pages=list(self.pages),
            condensed=list(self.condensed),
            hidden=list(self.hidden),
            offloads=list(self.offloads),
            image_texts=dict(self.image_texts),
        )

    # --- read helpers used by the proxy ---------------------------------------------------------
    @property
    def entry_count(self) -> int:
        return len(self.hash_blob) // HASH_SIZE

    @property
    def hashes(self) -> "EntryHashes":
        """The entry hashes as a read-only sequence of hex strings (`len(state.hashes)` = entry count)."""
        return EntryHashes(self.hash_blob)

    def entry_hash_list(self) -> list[str]:
        """The entry hashes as hex strings (as `entry_hash` returns them)."""
        return list(self.hashes)

    def active_start_entry(self) -> int:
        if self.first_active_page < len(self.pages):
            return self.pages[self.first_active_page].start
        return len(self.hash_blob) // HASH_SIZE


class EntryHashes(Sequence[str]):
    """Hex view over a blob of entry digests."""

    __slots__ = ("_blob",)

    def __init__(self, blob: bytes) -> None:
        self._blob = blob

    def __len__(self) -> int:
        return len(self._blob) // HASH_SIZE

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._blob[index * HASH_SIZE : (index + 1) * HASH_SIZE].hex()

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, EntryHashes)) else NotImplemented


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ConversationState)


def page_label(number: int, part: int) -> str:
    return str(number) if part == 1 else f"{number}.{part}"


def normalise_label(page: int | str | float) -> str:
    """Page references as the model writes them: 12, "12", "#12", "12.2"."""
    if isinstance(page, bool):
        raise ValueError(f"not a page number: {page!r}")
    if isinstance(page, int):
        return str(page)
    if isinstance(page, float):
        return str(int(page)) if page.is_integer() else repr(page)
    text = str(page).strip().lstrip("#").strip()
    if text.lower().startswith("page"):
        text = text[4:].strip().lstrip("#").strip()
    head, _, tail = text.partition(".")
    if not head.isdigit() or (tail and not tail.isdigit()):
        raise ValueError(f"not a page number: {page!r}")
    head = str(int(head))
    return head if not tail or int(tail) == 1 else f"{head}.{int(tail)}"


def find_page(state: ConversationState, page: int | str | float) -> int | None:
    """Index into `state.pages` of a page label, or None."""
    try:
        label = normalise_label(page)
    except ValueError:
        return None
    head, _, tail = label.partition(".")
    number, part = int(head), int(tail or 1)  # compared as numbers: no label string built per page
    pages = state.pages
    for index in range(len(pages) - 1, -1, -1):
        record = pages[index]
        if record.number == number and record.part == part:
            return index
    return None


def page_entry_range(state: ConversationState, page: int | str | float) -> tuple[int, int] | None:
    """Entry indices [start, end) of a page (to read its messages from the store), or None if unknown."""
    index = find_page(state, page)
    if index is None:
        return None
    record = state.pages[index]
    return record.start, record.end


def page_hidden_messages(state: ConversationState, page: int | str | float) -> list[tuple[int, list[dict[str, Any]]]]:
    """Hidden messages inside a page still held by the state (active pages), as (after entry index, messages)."""
    bounds = page_entry_range(state, page)
    if bounds is None:
        return []
    start, end = bounds
    return [(g.after, g.messages) for g in state.hidden if start <= g.after < end]


def archived_pages(state: ConversationState) -> list[str]:
    """Labels of pages that left the prompt and are listed on the contents page."""
    return [p.label for p in state.pages if p.status == ARCHIVED]


def evicted_pages(state: ConversationState) -> list[str]:
    """Labels of pages that also left the contents page (reachable only by the recall search)."""
    return [p.label for p in state.pages if p.status == EVICTED]


def page_table(state: ConversationState) -> list[dict[str, Any]]:
    """One row per page: label, entry range, status, recall statistics (for admin views and recall)."""
    return [
        {
            "page": p.label,
            "start": p.start,
            "end": p.end,
            "status": STATUS_NAMES[p.status],
            "tokens": p.tokens,
            "first_seen": p.first_seen,
            "recall_count": p.recall_count,
            "last_recalled_turn": p.last_recalled_turn,
        }
        for p in state.pages
    ]


def common_prefix_len(state: ConversationState | None, hashes: list[str]) -> int:
    """How many leading entry hashes (hex, as `entry_hashes` returns them) of a request the state holds."""
    if state is None:
        return 0
    return common_prefix_of_blobs(state.hash_blob, b"".join(bytes.fromhex(h) for h in hashes))


def common_prefix_of_blobs(known: bytes, request: bytes) -> int:
    """Leading entries two hash blobs share."""
    limit = min(len(known), len(request))
    if known[:limit] == request[:limit]:
        return limit // HASH_SIZE
    low, high = 0, limit // HASH_SIZE  # the first differing entry lies in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if known[low * HASH_SIZE : middle * HASH_SIZE] == request[low * HASH_SIZE : middle * HASH_SIZE]:
            low = middle
        else:
            high = middle
    return low


def common_prefix_of_records(known: Sequence[PageRecord], now: Sequence[PageRecord]) -> int:
    """Leading page records two lists share (compared in C: a pass, then a binary search on a difference)."""
    limit = min(len(known), len(now))
    if known[:limit] == now[:limit]:
        return limit
    low, high = 0, limit  # the first differing record lies in [low, high)
    while high - low > 1:
        middle = (low + high) // 2
        if known[low:middle] == now[low:middle]:
            low = middle
        else:
            high = middle
    return low
