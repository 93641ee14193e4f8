"""A person's rights against real processes (proxy, PostgreSQL, Redis, emulator): a user's conversations listed,
exported and deleted; after the delete none of their words is in any table, in Redis, or in any later upstream
request, while another user of the same app keeps everything of theirs.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import psycopg

from memci_proxy.store.sql.urls import to_libpq_url
from memci_proxy.turn.end_user import user_key
from memci_proxy.turn.identity import key_tenant
from tests.resilience.conftest import FILLER
from tests.resilience.walls import UpstreamLog, canary

KEY = "sk-one-app-for-everyone"
WINDOW = 4096


def filler(turn: int, words: int = 150) -> str:
    return " ".join(FILLER[(turn + i) % len(FILLER)] for i in range(words))


def chat(client: httpx.Client, url: str, messages: list[dict], user: str, session: str) -> str:
    r = client.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}", "X-Session-Id": session},
                    json={"model": "m", "messages": messages, "max_tokens": 48, "user": user}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"] or ""


def talk(client: httpx.Client, url: str, user: str, session: str, secret: str, turns: int) -> None:
    messages: list[dict] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        text = f"[[say:- The user keeps the code {secret}]] Turn {i}: my vault code is {secret}. {filler(i)}"
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": chat(client, url, messages, user, session)})


def rows_holding(db_url: str, needle: str) -> dict[str, int]:
    """Rows of every table of the public schema whose text, JSON or bytes hold ``needle``, by table and column."""
    found: dict[str, int] = {}
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = 'public' "
            "AND data_type IN ('text', 'jsonb', 'bytea', 'tsvector', 'ARRAY', 'character varying')").fetchall()
        for table, column, kind in columns:
            if kind == "bytea":
                where = f'position(%s::bytea in "{column}") > 0'  # noqa: S608
                arg: object = needle.encode()
            else:
                where = f'"{column}"::text LIKE %s'  # noqa: S608
                arg = f"%{needle.lower() if kind == 'tsvector' else needle}%"
            count = conn.execute(f'SELECT count(*) FROM "{table}" WHERE {where}', (arg,)).fetchone()[0]  # noqa: S608
            if count:
                found[f"{table}.{column}"] = count
    return found


def test_deleting_a_user_leaves_nothing_of_them(redis_proc, migrated_db_url, start_proxy, home, emulator_8k):
    env = {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url, "MEMCI_MEMORY_WORKERS": "true",
           "MEMCI_CONTEXT_WINDOW": str(WINDOW), "MEMCI_SUMMARY_CACHE_TTL_S": "0"}
    proxy = start_proxy(home / "p", env)
    upstream = UpstreamLog(emulator_8k)
    ada, bob = canary("Ada"), canary("Bob")
    tenant = key_tenant(KEY)
    with httpx.Client() as client:
        talk(client, proxy.url, "ada", "ada-1", ada, 16)
        talk(client, proxy.url, "ada", "ada-2", ada, 4)
        talk(client, proxy.url, "bob", "bob-1", bob, 16)
        r = client.post(proxy.url + "/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": "m", "input": f"Remember {ada} please.", "user": "ada", "store": True})
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60
        while not {"memory_profile_facts.fact", "user_pages.text"} <= set(rows_holding(migrated_db_url, ada)):
            assert time.monotonic() < deadline, rows_holding(migrated_db_url, ada)
            time.sleep(0.5)

        auth = {"Authorization": f"Bearer {KEY}"}
        listed = client.get(proxy.url + "/memci/users/ada/conversations", headers=auth).json()
        assert listed["user"] == user_key(tenant, "ada") and len(listed["data"]) == 3
        # the id itself is never shown (as a word: the conversations' hex ids may hold the letters a, d, a)
        assert not re.search(r"(?<![0-9a-z])ada(?![0-9a-z])", json.dumps(listed).replace(listed["user"], ""))
        exported = client.get(proxy.url + "/memci/users/ada/export", headers=auth)
        assert exported.status_code == 200 and ada in exported.text and bob not in exported.text
        assert any(ada in fact for fact in exported.json()["profile"])
        searched = client.post(proxy.url + "/memci/search", headers=auth, json={"query": "vault code", "user": "ada"})
        assert ada in searched.text and bob not in searched.text

        r = client.delete(proxy.url + "/memci/users/ada", headers=auth)
        assert r.status_code == 200 and r.json()["conversations"] == 3, r.text
        time.sleep(1.0)  # writes behind the answer, if any were still queued, have landed
        assert rows_holding(migrated_db_url, ada) == {}
        assert "memory_profile_facts.fact" in rows_holding(migrated_db_url, bob)  # Bob keeps his (the scan can fail)
        keys = [k.decode() for k in redis_proc.client().scan_iter()]
        assert not [k for k in keys if any(c["id"] in k for c in listed["data"])]
        assert client.get(proxy.url + "/memci/users/ada/conversations", headers=auth).json()["data"] == []

        # Ada again, in a new conversation: nothing of the old one reaches the upstream
        marker = canary("After")
        chat(client, proxy.url, [{"role": "user", "content": f"{marker}: what is my vault code?"}], "ada", "ada-3")
        assert [b for b in upstream.bodies_with(marker) if ada in b] == []
        assert proxy.log().count(ada) == 0 and proxy.log().count("ada-1") == 0
