"""What PostgreSQL cannot hold (U+0000, lone surrogates) and the store's own escape character, through every write of
the SQL adapter: stored, and read back exactly."""

from __future__ import annotations

from sqlalchemy import select

from memci_proxy.store.ports import EntryRow, EventRow, PageRow
from memci_proxy.store.sql import pgtext
from memci_proxy.store.sql.models import HiddenMessage
from memci_proxy.store.sql.response_chains import SqlResponseChains
from tests.integration.store.test_repository import TENANT, save

ODD = "nul \x00 lone \ud800 and \udfff, escape \ufdd0 and \ufdd00 and \ufdd0ud800, a\\u0000b"


async def test_a_turn_holding_nul_and_surrogates_is_stored_and_read_back(repo):
    await repo.create_conversation(TENANT, "c1")
    entries = [EntryRow(0, "h0", "user", {"role": "user", "content": ODD, ODD: [ODD, 1]}, 9),
               EntryRow(1, "h1", "assistant", {"role": "assistant", "content": "fine locker"}, 3)]
    pages = [PageRow("1", 0, 1, "archived", 12, "summary " + ODD)]
    await save(repo, "c1", entries=entries, pages=pages, contents=(1, "contents " + ODD),
               hidden=[(1, 0, {"role": "tool", "content": ODD})],
               events=[EventRow(TENANT, "c1", "turn", {"text": ODD})])
    assert await repo.load_entries(TENANT, "c1", 0, 1) == entries
    assert await repo.load_pages(TENANT, "c1", ("archived",)) == pages
    found = await repo.search_pages(TENANT, "c1", "locker")
    assert [page for page, _ in found] == pages
    assert (await repo.load_events(TENANT, "c1"))[0].payload == {"text": ODD}
    async with repo.engine.connect() as connection:
        hidden = (await connection.execute(select(HiddenMessage.__table__.c.message))).scalar_one()
    assert hidden == {"role": "tool", "content": ODD}
    assert await repo.set_page_summaries(TENANT, "c1", {"1": ODD + " again"}) == 1
    assert (await repo.load_pages(TENANT, "c1", ("archived",)))[0].summary == ODD + " again"
    await repo.append_events([EventRow(TENANT, "c1", "job", {ODD: ODD})])
    assert (await repo.load_events(TENANT, "c1", kinds=("job",)))[0].payload == {ODD: ODD}


async def test_a_search_for_nul_finds_the_page_holding_it(repo):
    await repo.create_conversation(TENANT, "c1")
    entries = [EntryRow(0, "h0", "user", {"role": "user", "content": "the code is x\x00y"}, 5),
               EntryRow(1, "h1", "assistant", {"role": "assistant", "content": "noted"}, 1)]
    await save(repo, "c1", entries=entries, pages=[PageRow("1", 0, 1, "archived", 6, "code")])
    assert [page.number for page, _ in await repo.search_pages(TENANT, "c1", "x\x00y")] == ["1"]


async def test_response_chains_hold_nul_in_ids_and_messages(repo):
    chains = SqlResponseChains(repo.engine)
    turn = [{"role": "user", "content": ODD}, {"role": "assistant", "content": "ok", "name": ODD}]
    await chains.put_response("t1", "resp_1", None, turn)
    await chains.put_response("t1", "resp_2", "resp_1", turn)
    assert await chains.load_chain("t1", "resp_2") == turn + turn
    assert await chains.load_chain("t1", "resp_\x00") is None
    assert await chains.load_chain("t1", "resp_\ud800" + pgtext.ESCAPE) is None
