"""The pages' PostgreSQL full-text index end to end (openai SDK -> proxy -> emulator, the proxy on its own database):
off by default, nothing computes ``pages.tsv``; with ``MEMCI_PAGE_FULLTEXT=true`` the archived pages get it behind
the answer. The answers and the prompts are the same either way (nothing the proxy ranks with reads it)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

WINDOW = 4096


def _archived_tsv(db_url: str) -> list[bool]:
    """Whether each archived (non-active) page has a tsvector."""
    async def read() -> list[bool]:
        connection = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            rows = await connection.fetch("SELECT tsv IS NOT NULL AS indexed FROM pages WHERE state <> 'active'")
            return [row["indexed"] for row in rows]
        finally:
            await connection.close()

    return asyncio.run(read())


def _chat_past_an_epoch(client) -> int:
    messages: list[dict] = []
    for turn in range(60):
        messages.append({"role": "user", "content": f"Turn {turn}: the lighthouse keeper logs ship {turn}. [[len:120]]"})
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=200)
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        if int(raw.headers.get("x-memci-pages-archived", "0")) >= 2:
            return turn
    raise AssertionError("no epoch in 60 turns")


@pytest.mark.parametrize("fulltext", [False, True])
def test_pages_are_full_text_indexed_only_when_asked(emulator_and_proxy, client_for, migrated_db_url, fulltext):
    env = {"MEMCI_CONTEXT_WINDOW": str(WINDOW), "DATABASE_URL": migrated_db_url}
    if fulltext:
        env["MEMCI_PAGE_FULLTEXT"] = "true"
    pair = emulator_and_proxy(WINDOW, env)
    _chat_past_an_epoch(client_for(pair.proxy))
    deadline = time.monotonic() + 10
    indexed = _archived_tsv(migrated_db_url)
    while fulltext and not all(indexed) and time.monotonic() < deadline:  # made behind the answer
        time.sleep(0.1)
        indexed = _archived_tsv(migrated_db_url)
    assert indexed, "no archived page stored"
    assert all(indexed) if fulltext else not any(indexed)
