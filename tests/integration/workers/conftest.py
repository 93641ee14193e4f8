"""Fixtures of the memory worker tests: the emulator as summariser, conversations with archived pages."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.emulator.testing import running_emulator
from memci_proxy.store.ports import EntryRow, PageRow
from memci_proxy.store.sql.repository import SqlConversationRepository

TENANT = "tenant-a"


@pytest.fixture(scope="session")
def emulator_url() -> Iterator[str]:
    with running_emulator(EmulatorConfig(model="emu-summariser")) as url:
        yield url


class History:
    """Writes a conversation's messages and pages the way the managed turn does (save_turn)."""

    def __init__(self, repo: SqlConversationRepository, conversation_id: str, tenant: str = TENANT,
                 end_user: str = "") -> None:
        self.repo, self.conversation_id, self.tenant, self.end_user = repo, conversation_id, tenant, end_user
        self.entries: list[EntryRow] = []
        self.pages: list[PageRow] = []
        self.version = 0

    async def create(self) -> "History":
        await self.repo.create_conversation(self.tenant, self.conversation_id, end_user=self.end_user)
        return self

    async def add_pages(self, texts: list[tuple[str, str]], state: str = "archived") -> None:
        """One page per (user text, assistant text)."""
        new_entries, new_pages = [], []
        for user, answer in texts:
            seq = len(self.entries) + len(new_entries)
            for offset, (role, content) in enumerate((("user", user), ("assistant", answer))):
                new_entries.append(EntryRow(seq + offset, f"{self.conversation_id}-{seq + offset}", role,
                                            {"role": role, "content": content}, 10))
            new_pages.append(PageRow(str(len(self.pages) + len(new_pages) + 1), seq, seq + 1, state, 20, ""))
        self.entries += new_entries
        self.pages += new_pages
        await self._save(new_entries, new_pages)

    async def set_state(self, numbers: list[str], state: str) -> None:
        changed = []
        for page in self.pages:
            if page.number in numbers:
                page.state = state
                changed.append(page)
        await self._save([], changed)

    async def _save(self, entries: list[EntryRow], pages: list[PageRow]) -> None:
        self.version += 1
        await self.repo.save_turn(self.tenant, self.conversation_id, entries, pages, [], b"state", self.version, [])

    async def date_entries(self, stamps: dict[int, dt.datetime]) -> None:
        """Give messages the time they were stored at (a synthetic history)."""
        async with self.repo.engine.begin() as connection:
            for seq, when in stamps.items():
                await connection.execute(
                    text("UPDATE entries SET created_at = :when WHERE conversation_id = :c AND seq = :s"),
                    {"when": when, "c": self.conversation_id, "s": seq},
                )


async def rows_of(repo: SqlConversationRepository, table: str, conversation_id: str) -> list[Any]:
    async with repo.engine.connect() as connection:
        return list((await connection.execute(
            text(f"SELECT * FROM {table} WHERE conversation_id = :c"), {"c": conversation_id}
        )).all())
