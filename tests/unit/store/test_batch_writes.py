"""How a batch write's outcomes are told apart when memci_save_turns did not apply a snapshot."""

from __future__ import annotations

from memci_proxy.store.ports import SnapshotBase, TurnWrite, snapshot_digest
from memci_proxy.store.sql import batch_writes


class FakeConnection:
    """Answers the function call with the ids that applied, then the stored rows of the others."""

    def __init__(self, applied: list[str], stored: list[dict]) -> None:
        self.applied, self.stored = applied, stored
        self.calls: list[str] = []

    async def fetch(self, sql: str, *args):
        self.calls.append(sql)
        if sql == batch_writes.SAVE_TURNS:
            assert len(args) == 38 and args[-1] is False  # 37 arrays, then index_behind (migration 0010)
            return [(cid,) for cid in self.applied]
        return self.stored


def write(cid: str, version: int, base: SnapshotBase | None, snapshot: bytes = b"new") -> TurnWrite:
    return TurnWrite("t", cid, snapshot, version, base)


async def test_outcomes():
    base = SnapshotBase(4, snapshot_digest(b"v4"))
    stored = [
        {"id": "replayed", "tenant": "t", "state_version": 5, "digest": snapshot_digest(b"new")},
        {"id": "behind", "tenant": "t", "state_version": 3, "digest": "x"},
        {"id": "just-landed", "tenant": "t", "state_version": 4, "digest": snapshot_digest(b"v4")},
        {"id": "stale", "tenant": "t", "state_version": 4, "digest": "other"},
        {"id": "other-tenant", "tenant": "u", "state_version": 4, "digest": "x"},
    ]
    connection = FakeConnection(["saved"], stored)
    writes = [write("saved", 5, base), write("replayed", 5, base), write("behind", 5, base),
              write("just-landed", 5, base), write("stale", 5, base), write("other-tenant", 5, base),
              write("missing", 5, base)]
    outcomes = await batch_writes.save_turns(connection, writes)
    # the base stored by another writer between the call and the read: tried again, not a conflict
    assert outcomes == ["saved", "replayed", "behind", "behind", "stale", "not_found", "not_found"]


async def test_all_applied_is_one_round_trip():
    connection = FakeConnection(["a", "b"], [])
    assert await batch_writes.save_turns(connection, [write("a", 1, None), write("b", 1, None)]) == ["saved"] * 2
    assert connection.calls == [batch_writes.SAVE_TURNS]
