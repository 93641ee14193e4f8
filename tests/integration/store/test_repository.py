"""SqlConversationRepository on a real, freshly migrated PostgreSQL database."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from memci_proxy.store.ports import (
    ConversationAdmin,
    ConversationConflict,
    ConversationNotFound,
    ConversationRepository,
    EntryRow,
    EventRow,
    PageRow,
    SnapshotBase,
    SnapshotBehind,
    StaleState,
    TurnWrite,
    snapshot_digest,
)
from memci_proxy.store.sql.models import Base
from memci_proxy.store.sql.repository import SqlConversationRepository

TENANT, OTHER_TENANT = "tenant-a", "tenant-b"


def make_entries(first: int, last: int) -> list[EntryRow]:
    return [
        EntryRow(
            seq=i,
            hash=f"m{i}",
            role="user" if i % 2 == 0 else "assistant",
            message={"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} about topic{i}"},
            tokens=7,
        )
        for i in range(first, last + 1)
    ]


def make_pages(count: int, state: str = "active") -> list[PageRow]:
    """Page n covers entries 2(n-1) and 2(n-1)+1."""
    return [PageRow(str(n), 2 * (n - 1), 2 * (n - 1) + 1, state, 14, f"summary of page {n}") for n in range(1, count + 1)]


def chain(prefix: str, count: int) -> list[tuple[str, int]]:
    return [(f"{prefix}{i}", i + 1) for i in range(count)]


async def save(
    repo: SqlConversationRepository,
    conversation_id: str,
    entries: list[EntryRow] | None = None,
    pages: list[PageRow] | None = None,
    fingerprints: list[tuple[str, int]] | None = None,
    version: int = 1,
    snapshot: bytes = b"state",
    events: list[EventRow] | None = None,
    contents: tuple[int, str] | None = None,
    hidden: list[tuple[int, int, dict]] | None = None,
    tenant: str = TENANT,
) -> None:
    await repo.save_turn(
        tenant,
        conversation_id,
        entries if entries is not None else make_entries(0, 3),
        pages if pages is not None else make_pages(2),
        fingerprints if fingerprints is not None else chain(f"{conversation_id}-", 4),
        snapshot,
        version,
        events if events is not None else [EventRow(tenant, conversation_id, "turn", {"n": version})],
        contents=contents,
        hidden=hidden or [],
    )


async def row_counts(repo: SqlConversationRepository, conversation_id: str) -> dict[str, int]:
    counts = {}
    async with repo.engine.connect() as connection:
        for table in Base.metadata.sorted_tables:
            if table.name != "conversations" and "conversation_id" not in table.c:
                continue  # not a conversation's table (virtual keys)
            column = table.c.id if table.name == "conversations" else table.c.conversation_id
            counts[table.name] = (
                await connection.execute(select(func.count()).select_from(table).where(column == conversation_id))
            ).scalar_one()
    return counts


def test_implements_the_port(repo: SqlConversationRepository) -> None:
    assert isinstance(repo, ConversationRepository)


async def test_ping(repo: SqlConversationRepository) -> None:
    assert await repo.ping()


async def test_save_turn_round_trip(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1", session_key="s1")
    await save(repo, "c1", contents=(1, "contents v1"), hidden=[(1, 0, {"role": "tool", "content": "r"})])

    assert await repo.load_snapshot(TENANT, "c1") == (b"state", 1)
    assert await repo.find_by_session_key(TENANT, "s1") == "c1"
    assert await repo.load_entries(TENANT, "c1", 0, 3) == make_entries(0, 3)
    assert await repo.load_pages(TENANT, "c1", ("active",)) == make_pages(2)
    assert await repo.load_pages(TENANT, "c1") == []


async def test_a_conversation_without_a_turn_has_no_snapshot(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    assert await repo.load_snapshot(TENANT, "c1") is None


async def test_save_turn_is_idempotent(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", contents=(1, "contents"), hidden=[(1, 0, {"role": "tool", "content": "r"})])
    first = await row_counts(repo, "c1")
    await save(repo, "c1", contents=(1, "contents"), hidden=[(1, 0, {"role": "tool", "content": "r"})])

    assert await row_counts(repo, "c1") == first
    assert {table: n for table, n in first.items() if n} == {
        "conversations": 1,
        "entries": 4,
        "pages": 2,
        "fingerprints": 4,
        "hidden_messages": 1,
        "contents_snapshots": 1,
        "events": 1,
    }
    assert await repo.load_snapshot(TENANT, "c1") == (b"state", 1)


async def test_entries_change_only_by_an_edit_pages_take_their_latest_form(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", version=1)
    changed_entry = EntryRow(0, "other", "user", {"role": "user", "content": "rewritten"}, 1)
    archived = [PageRow("1", 0, 1, "archived", 14, "new summary"), PageRow("2", 2, 4, "active", 20, "grown")]
    await save(repo, "c1", entries=[changed_entry, *make_entries(4, 4)], pages=archived, version=2, snapshot=b"v2")

    assert (await repo.load_entries(TENANT, "c1", 0, 0)) == [changed_entry]  # another hash: an edited history
    same_hash = EntryRow(0, "other", "user", {"role": "user", "content": "ignored"}, 9)
    await save(repo, "c1", entries=[same_hash], pages=archived, version=3, snapshot=b"v2")
    assert (await repo.load_entries(TENANT, "c1", 0, 0)) == [changed_entry]  # same hash: first write wins
    assert await repo.load_pages(TENANT, "c1", ("archived",)) == [archived[0]]
    assert await repo.load_pages(TENANT, "c1", ("active",)) == [archived[1]]
    both = ("archived", "active")
    assert await repo.load_pages(TENANT, "c1", both, after_seq=1) == [archived[1]]  # pages starting after entry 1
    assert await repo.load_pages(TENANT, "c1", both, after_seq=-1) == archived
    assert await repo.load_snapshot(TENANT, "c1") == (b"v2", 3)
    async with repo.engine.connect() as connection:
        archived_at = (
            await connection.execute(text("SELECT number, archived_at IS NOT NULL FROM pages ORDER BY number"))
        ).all()
    assert archived_at == [("1", True), ("2", False)]


async def test_a_fork_starts_with_a_copy_of_its_parents_prefix(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "parent")
    hidden = [(1, 0, {"content": "h1"}), (4, 0, {"content": "h4"})]
    await save(repo, "parent", entries=make_entries(0, 5), hidden=hidden)
    await repo.create_conversation(TENANT, "fork", parent_id="parent", forked_at=3)
    assert await repo.load_entries(TENANT, "fork", 0, 10) == make_entries(0, 2)
    query = text("SELECT after_seq FROM hidden_messages WHERE conversation_id = 'fork'")
    async with repo.engine.connect() as connection:
        assert (await connection.execute(query)).scalars().all() == [1]
    # Another tenant cannot fork someone else's conversation into its own.
    await repo.create_conversation(OTHER_TENANT, "theft", parent_id="parent", forked_at=3)
    assert await repo.load_entries(OTHER_TENANT, "theft", 0, 10) == []
    # The fork stands alone: deleting the parent keeps the fork's messages.
    assert await repo.delete_conversation(TENANT, "parent")
    assert await repo.load_entries(TENANT, "fork", 0, 10) == make_entries(0, 2)


async def test_an_older_snapshot_is_refused(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", version=5, snapshot=b"v5")
    with pytest.raises(StaleState):
        await save(repo, "c1", entries=make_entries(4, 5), version=4, snapshot=b"v4")
    assert await repo.load_snapshot(TENANT, "c1") == (b"v5", 5)
    assert await repo.load_entries(TENANT, "c1", 4, 5) == []  # the whole turn rolled back


async def test_the_same_version_with_other_content_is_refused(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", version=5, snapshot=b"v5")
    with pytest.raises(StaleState):
        await save(repo, "c1", entries=make_entries(4, 5), version=5, snapshot=b"another v5")
    await save(repo, "c1", version=5, snapshot=b"v5")  # the same snapshot again: a harmless replay
    assert await repo.load_snapshot(TENANT, "c1") == (b"v5", 5)
    assert await repo.load_entries(TENANT, "c1", 4, 5) == []


async def test_a_snapshot_with_a_base_is_compared_and_set(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await repo.create_conversation(TENANT, "c2")
    nothing = SnapshotBase(0, None)
    assert await repo.save_turns([
        TurnWrite(TENANT, "c1", b"v1", 1, nothing, entries=make_entries(0, 1)),
        TurnWrite(TENANT, "c2", b"w1", 1, nothing),
        TurnWrite(TENANT, "missing", b"x", 1, nothing),
    ]) == ["saved", "saved", "not_found"]
    v1 = SnapshotBase(1, snapshot_digest(b"v1"))
    assert await repo.save_turns([TurnWrite(TENANT, "c1", b"v3", 3, v1, entries=make_entries(2, 3))]) == ["saved"]
    # planned from v1 again: another state is stored now
    assert await repo.save_turns([TurnWrite(TENANT, "c1", b"v3'", 3, v1, entries=make_entries(4, 5))]) == ["stale"]
    # planned from a v5 that has not landed yet
    later = SnapshotBase(5, snapshot_digest(b"v5"))
    assert await repo.save_turns([TurnWrite(TENANT, "c1", b"v6", 6, later)]) == ["behind"]
    with pytest.raises(SnapshotBehind):
        await repo.save_turn(TENANT, "c1", [], [], [], b"v6", 6, [], base=later)
    # the same version and digest, other bytes: a conflict, not a match
    assert await repo.save_turns([TurnWrite(TENANT, "c1", b"v4", 4, SnapshotBase(3, snapshot_digest(b"v1")))]) == ["stale"]
    assert await repo.save_turns([TurnWrite(TENANT, "c1", b"v3", 3, v1)]) == ["replayed"]
    assert await repo.load_snapshot(TENANT, "c1") == (b"v3", 3)
    assert [e.seq for e in await repo.load_entries(TENANT, "c1", 0, 10)] == [0, 1, 2, 3]


async def test_contents_and_hidden_messages_are_upserted(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", version=1, contents=(1, "old"), hidden=[(3, 0, {"content": "old"})])
    await save(repo, "c1", version=2, contents=(1, "new"), hidden=[(3, 0, {"content": "new"})])
    async with repo.engine.connect() as connection:
        contents = (await connection.execute(text("SELECT epoch, text FROM contents_snapshots"))).all()
        hidden = (await connection.execute(text("SELECT after_seq, ordinal, message FROM hidden_messages"))).all()
    assert contents == [(1, "new")]
    assert hidden == [(3, 0, {"content": "new"})]


async def test_page_text_is_searchable(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", pages=make_pages(2, "archived"))
    query = text("SELECT number FROM pages WHERE tsv @@ to_tsquery('simple', :q) ORDER BY number")
    async with repo.engine.connect() as connection:
        by_message = (await connection.execute(query, {"q": "topic3"})).scalars().all()
        by_summary = (await connection.execute(query, {"q": "summary & 1"})).scalars().all()
    assert by_message == ["2"]
    assert by_summary == ["1"]


async def page_tsv(repo: SqlConversationRepository, conversation_id: str) -> dict[str, str | None]:
    query = text("SELECT number, tsv::text FROM pages WHERE conversation_id = :c ORDER BY number")
    async with repo.engine.connect() as connection:
        return {number: tsv for number, tsv in (await connection.execute(query, {"c": conversation_id})).all()}


async def test_an_active_page_is_indexed_once_it_leaves_the_prompt(repo: SqlConversationRepository) -> None:
    async def found(query: str) -> list[str]:
        return [p.number for p, _ in await repo.search_pages(TENANT, "c1", query, states=("active", "archived", "evicted"))]

    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1")  # two active pages
    assert await page_tsv(repo, "c1") == {"1": None, "2": None}
    assert await found("topic1") == []

    # An entry of the active page 2 is edited: still no tsvector while the page is active.
    edited = EntryRow(3, "m3b", "assistant", {"role": "assistant", "content": "hiking in Hokkaido"}, 7)
    await save(repo, "c1", entries=[edited], pages=[], version=2, snapshot=b"v2")
    assert await page_tsv(repo, "c1") == {"1": None, "2": None}

    # Both pages archived, ranges unchanged: searchable, page 2 by its edited text.
    await save(repo, "c1", entries=[], pages=make_pages(2, "archived"), version=3, snapshot=b"v3")
    assert await found("topic1") == ["1"]
    assert await found("hokkaido") == ["2"]
    assert await found("topic3") == []

    # An entry of the archived page 1 is edited in place: its tsvector follows.
    edited = EntryRow(1, "m1b", "assistant", {"role": "assistant", "content": "sushi in Osaka"}, 7)
    await save(repo, "c1", entries=[edited], pages=[], version=4, snapshot=b"v4")
    assert await found("osaka") == ["1"]
    assert await found("topic1") == []

    # Evicted, then a recall count: the tsvector is kept.
    tsv = await page_tsv(repo, "c1")
    evicted = [PageRow(p.number, p.first_seq, p.last_seq, "evicted", p.tokens, p.summary, recall_count=2)
               for p in make_pages(2)]
    await save(repo, "c1", entries=[], pages=evicted, version=5, snapshot=b"v5")
    assert await page_tsv(repo, "c1") == tsv

    # A stored page's range changes: its tsvector follows.
    await save(repo, "c1", entries=[], pages=[PageRow("1", 0, 2, "evicted", 21, "summary of page 1")], version=6,
               snapshot=b"v6")
    assert sorted(await found("topic2")) == ["1", "2"]


async def test_pages_archived_by_a_write_with_index_behind_are_indexed_after(repo: SqlConversationRepository) -> None:
    async def found(query: str) -> list[str]:
        return sorted(p.number for p, _ in await repo.search_pages(TENANT, "c1", query))

    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", entries=make_entries(0, 5), pages=make_pages(3))  # three active pages
    archived = make_pages(2, "archived")
    write = TurnWrite(TENANT, "c1", b"v2", 2, None, pages=archived, index_behind=True)
    assert await repo.save_turns([write]) == ["saved"]
    assert await page_tsv(repo, "c1") == {"1": None, "2": None, "3": None}  # stored, not indexed yet
    assert [p.number for p in await repo.load_pages(TENANT, "c1")] == ["1", "2"]  # readable at once
    assert await found("topic1") == []
    assert await repo.index_pages(OTHER_TENANT, "c1", ["1", "2"]) == 0  # another tenant's: nothing
    assert await repo.index_pages(TENANT, "c1", ["1", "2", "3"]) == 2  # the active page 3 stays unindexed
    assert await found("topic1") == ["1"] and await found("topic3") == ["2"]
    assert await repo.index_pages(TENANT, "c1", ["1", "2"]) == 0  # indexed already

    # a stopped process's leftovers; the next write without index_behind computes inline as before
    later = TurnWrite(TENANT, "c1", b"v3", 3, None, pages=make_pages(3, "evicted")[2:], index_behind=True)
    assert await repo.save_turns([later]) == ["saved"]
    assert await found("topic5") == []
    assert await repo.index_left_pages() == 1
    assert await found("topic5") == ["3"]
    evicted = TurnWrite(TENANT, "c1", b"v4", 4, None, pages=[PageRow("1", 0, 2, "evicted", 21, "summary of page 1")])
    assert await repo.save_turns([evicted]) == ["saved"]
    assert await found("topic2") == ["1", "2"]


async def test_other_tenants_see_nothing(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1", session_key="s1")
    await save(repo, "c1", pages=make_pages(2, "archived"))

    assert await repo.load_snapshot(OTHER_TENANT, "c1") is None
    assert await repo.find_by_session_key(OTHER_TENANT, "s1") is None
    assert await repo.load_entries(OTHER_TENANT, "c1", 0, 100) == []
    assert await repo.load_pages(OTHER_TENANT, "c1") == []
    assert await repo.find_longest_prefix(OTHER_TENANT, ["c1-0", "c1-1"]) is None
    with pytest.raises(ConversationNotFound):
        await save(repo, "c1", tenant=OTHER_TENANT, version=9)
    with pytest.raises(ConversationConflict):
        await repo.create_conversation(OTHER_TENANT, "c1")
    await repo.update_recall_stats(OTHER_TENANT, "c1", ["1"], 3)
    assert not await repo.delete_conversation(OTHER_TENANT, "c1")

    assert await repo.load_snapshot(TENANT, "c1") == (b"state", 1)
    assert [p.recall_count for p in await repo.load_pages(TENANT, "c1")] == [0, 0]


async def test_create_conversation(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1", session_key="s1")
    await repo.create_conversation(TENANT, "c1", session_key="s1")  # idempotent
    with pytest.raises(ConversationConflict):
        await repo.create_conversation(TENANT, "c2", session_key="s1")
    await repo.create_conversation(OTHER_TENANT, "c3", session_key="s1")
    await repo.create_conversation(TENANT, "fork", parent_id="c1", forked_at=3)
    assert await repo.find_by_session_key(TENANT, "s1") == "c1"
    assert await repo.find_by_session_key(OTHER_TENANT, "s1") == "c3"
    with pytest.raises(ConversationNotFound):
        await save(repo, "missing")


async def test_find_longest_prefix_with_a_fork(repo: SqlConversationRepository) -> None:
    # A: messages a0..a5. B forks A after 3 messages: shares a0..a2, then b3, b4.
    await repo.create_conversation(TENANT, "A")
    await save(repo, "A", fingerprints=chain("a", 6))
    await repo.create_conversation(TENANT, "B", parent_id="A", forked_at=3)
    await save(repo, "B", fingerprints=[*chain("a", 3), ("b3", 4), ("b4", 5)])

    assert await repo.find_longest_prefix(TENANT, ["a0", "a1", "a2", "b3", "b4", "new"]) == ("B", 5)
    assert await repo.find_longest_prefix(TENANT, ["a0", "a1", "a2", "a3", "a4", "a5", "new"]) == ("A", 6)
    assert await repo.find_longest_prefix(TENANT, ["a0", "a1", "a2", "other"]) == ("A", 3)  # first owner kept
    assert await repo.find_longest_prefix(TENANT, ["a0", "a1", "a2", "b3"]) == ("B", 4)
    assert await repo.find_longest_prefix(TENANT, ["x0", "x1"]) is None
    assert await repo.find_longest_prefix(TENANT, []) is None


async def test_find_longest_prefix_of_ten_thousand_messages(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "long")
    await save(repo, "long", entries=[], pages=[], fingerprints=chain("h", 10_000))
    hashes = [f"h{i}" for i in range(10_000)]
    assert await repo.find_longest_prefix(TENANT, [*hashes, "next"]) == ("long", 10_000)
    assert await repo.find_longest_prefix(TENANT, [*hashes[:1234], "fork", "more"]) == ("long", 1234)


async def test_load_entries_ranges(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", entries=make_entries(0, 9), pages=[])
    assert [e.seq for e in await repo.load_entries(TENANT, "c1", 2, 5)] == [2, 3, 4, 5]
    assert [e.seq for e in await repo.load_entries(TENANT, "c1", 7, 7)] == [7]
    assert [e.seq for e in await repo.load_entries(TENANT, "c1", 8, 50)] == [8, 9]
    assert await repo.load_entries(TENANT, "c1", 20, 30) == []
    assert await repo.load_entries(TENANT, "c1", 5, 2) == []


async def test_recall_stats(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", pages=make_pages(3, "archived"))
    await repo.update_recall_stats(TENANT, "c1", ["1", "3"], turn=10)
    await repo.update_recall_stats(TENANT, "c1", ["1"], turn=12)
    await repo.update_recall_stats(TENANT, "c1", ["1", "no-such-page"], turn=11)

    pages = {p.number: p for p in await repo.load_pages(TENANT, "c1")}
    assert (pages["1"].recall_count, pages["1"].last_recalled_turn) == (3, 12)
    assert (pages["2"].recall_count, pages["2"].last_recalled_turn) == (0, None)
    assert (pages["3"].recall_count, pages["3"].last_recalled_turn) == (1, 10)

    # A later turn that re-sends the pages without the counts does not lose them.
    await save(repo, "c1", pages=make_pages(3, "evicted"), version=2, snapshot=b"v2")
    pages = {p.number: p for p in await repo.load_pages(TENANT, "c1", ("evicted",))}
    assert (pages["1"].recall_count, pages["1"].last_recalled_turn) == (3, 12)


async def test_set_page_summaries(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    await save(repo, "c1", pages=make_pages(2, "archived"))
    assert await repo.set_page_summaries(OTHER_TENANT, "c1", {"1": "stolen"}) == 0
    assert await repo.set_page_summaries(TENANT, "c1", {"1": "better", "9": "none"}) == 1
    assert [p.summary for p in await repo.load_pages(TENANT, "c1")] == ["better", "summary of page 2"]
    query = text("SELECT number FROM pages WHERE tsv @@ to_tsquery('simple', 'better')")
    async with repo.engine.connect() as connection:
        assert (await connection.execute(query)).scalars().all() == ["1"]


async def test_delete_removes_every_row_of_the_conversation(repo: SqlConversationRepository) -> None:
    for cid in ("gone", "kept"):
        await repo.create_conversation(TENANT, cid, session_key=cid)
        await save(repo, cid, contents=(1, "c"), hidden=[(1, 0, {"content": "h"})])
    await repo.append_events([EventRow(TENANT, "gone", "archive_backlog", {"pages": 3})])
    kept_before = await row_counts(repo, "kept")

    assert await repo.delete_conversation(TENANT, "gone")
    assert set((await row_counts(repo, "gone")).values()) == {0}
    assert await row_counts(repo, "kept") == kept_before
    assert not await repo.delete_conversation(TENANT, "gone")
    assert await repo.find_by_session_key(TENANT, "gone") is None
    assert await repo.find_longest_prefix(TENANT, ["gone-0", "gone-1"]) is None


async def test_admin_queries(repo: SqlConversationRepository) -> None:
    assert isinstance(repo, ConversationAdmin)
    for cid in ("old", "new"):
        await repo.create_conversation(TENANT, cid, session_key=f"s-{cid}")
        await save(repo, cid)
    await repo.create_conversation(OTHER_TENANT, "theirs")

    listed = await repo.list_conversations(TENANT)
    assert [c.id for c in listed] == ["new", "old"]
    assert (listed[0].entries, listed[0].pages, listed[0].state_version) == (4, 2, 1)
    assert [c.id for c in await repo.list_conversations(TENANT, before=listed[0].last_active_at)] == ["old"]
    assert await repo.get_conversation(OTHER_TENANT, "old") is None

    assert await repo.set_label(TENANT, "old", "travel plans")
    assert not await repo.set_label(OTHER_TENANT, "old", "stolen")
    info = await repo.get_conversation(TENANT, "old")
    assert info is not None and (info.label, info.session_key) == ("travel plans", "s-old")

    await repo.append_events([EventRow(TENANT, "old", "archive_backlog", {"pages": 2})])
    events = await repo.load_events(TENANT, "old")
    assert [(e.kind, e.payload) for e in events] == [("archive_backlog", {"pages": 2}), ("turn", {"n": 1})]
    assert [e.kind for e in await repo.load_events(TENANT, kinds=("archive_backlog",))] == ["archive_backlog"]
    assert await repo.load_events(OTHER_TENANT) == []


async def test_search_pages(repo: SqlConversationRepository) -> None:
    await repo.create_conversation(TENANT, "c1")
    entries = [
        EntryRow(0, "a", "user", {"role": "user", "content": "Plan a trip to Kyoto in April"}, 8),
        EntryRow(1, "b", "assistant", {"role": "assistant", "content": "Cherry blossoms peak early April."}, 8),
        EntryRow(2, "c", "user", {"role": "user", "content": "Now fix the parser bug"}, 6),
        EntryRow(3, "d", "assistant", {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "edit", "arguments": "{\"file\": \"parser.py\"}"}}
        ]}, 6),
        EntryRow(4, "e", "user", {"role": "user", "content": "我们去京都"}, 4),
    ]
    pages = [
        PageRow("1", 0, 1, "archived", 16, "trip planning"),
        PageRow("2", 2, 3, "evicted", 12, "parser fix"),
        PageRow("3", 4, 4, "active", 4, ""),
    ]
    await save(repo, "c1", entries=entries, pages=pages)

    found = await repo.search_pages(TENANT, "c1", "kyoto blossoms")
    assert [p.number for p, _ in found] == ["1"]
    assert [p.number for p, _ in await repo.search_pages(TENANT, "c1", "parser.py")] == ["2"]  # tool arguments
    assert {p.number for p, _ in await repo.search_pages(TENANT, "c1", "april OR parser")} == {"1", "2"}
    assert await repo.search_pages(TENANT, "c1", "京都") == []  # active pages are not searched by default
    assert await repo.search_pages(OTHER_TENANT, "c1", "kyoto") == []
    assert await repo.search_pages(TENANT, "c1", "") == []

    # An entry edited in place is searchable by its new text.
    edited = EntryRow(1, "b2", "assistant", {"role": "assistant", "content": "Maple leaves in November."}, 8)
    await save(repo, "c1", entries=[edited], pages=[], version=2, snapshot=b"v2")
    assert [p.number for p, _ in await repo.search_pages(TENANT, "c1", "maple")] == ["1"]
    assert await repo.search_pages(TENANT, "c1", "blossoms") == []


async def test_without_page_fulltext_no_write_of_its_sessions_computes_a_tsvector(migrated_db_url: str) -> None:
    from memci_proxy.store.sql.repository import create_engine_from_url

    engine = create_engine_from_url(migrated_db_url, pool_size=1, max_overflow=0, fulltext=False)
    writes = create_engine_from_url(migrated_db_url, pool_size=1, max_overflow=0, pre_ping=False, fulltext=False)
    repo = SqlConversationRepository(engine, writes)
    try:
        await repo.create_conversation(TENANT, "c1")
        await save(repo, "c1", entries=make_entries(0, 5), pages=make_pages(3))
        # archived by a write without index_behind (the write-behind path), then summarised: still no tsvector
        assert await repo.save_turns([TurnWrite(TENANT, "c1", b"v2", 2, None, pages=make_pages(2, "archived"))]) == [
            "saved"]
        assert await repo.set_page_summaries(TENANT, "c1", {"1": "kyoto blossoms"}) == 1
        assert await page_tsv(repo, "c1") == {"1": None, "2": None, "3": None}
        assert [p.number for p in await repo.load_pages(TENANT, "c1")] == ["1", "2"]  # archived, stored and readable
    finally:
        await engine.dispose()
        await writes.dispose()
    indexing = create_engine_from_url(migrated_db_url, pool_size=1, max_overflow=0)  # page_fulltext turned on
    repo = SqlConversationRepository(indexing)
    try:
        assert await repo.index_left_pages() == 2  # what was archived meanwhile, at the next start
        assert sorted(p.number for p, _ in await repo.search_pages(TENANT, "c1", "kyoto")) == ["1"]
    finally:
        await indexing.dispose()
