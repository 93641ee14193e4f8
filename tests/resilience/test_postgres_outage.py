"""PostgreSQL stopped mid-conversation: every request still gets a valid answer (no archiving, a prompt trimmed to
the window when it must be), and once PostgreSQL is back every message the client sent is stored."""

from __future__ import annotations

import httpx

from tests.resilience.conftest import last_chat_prompt, WINDOW, Chat, metric_value, search_finds, stored_user_texts


def test_postgres_stopped_and_started_mid_conversation(pg_proc, emulator_8k, home, start_proxy):
    db = pg_proc.create_database("pgout")
    proxy = start_proxy(home, {"DATABASE_URL": db})
    chat = Chat(proxy.url, "pgout")
    sent: list[str] = []
    with httpx.Client() as client:
        def turn(i: int) -> httpx.Response:
            text = chat.user_text(i, pad=300)
            r = chat.send(client, text)
            assert r.status_code == 200, (r.text, proxy.log())
            assert r.json()["usage"]["prompt_tokens"] + 128 <= WINDOW
            sent.append(text)
            return r

        for i in range(14):
            r = turn(i)
        archived_before = int(r.headers["x-memci-pages-archived"])
        assert archived_before > 0
        pg_proc.stop()
        try:
            for i in range(14, 26):  # long enough that the prompt would overflow the window without trimming
                turn(i)
        finally:
            pg_proc.start()
        assert metric_value(proxy.url, "memci_store_write_failures_total") > 0
        for i in range(26, 30):
            r = turn(i)
        assert r.headers.get("x-memci-conversation-id") == chat.conversation_id
    assert stored_user_texts(db, chat.conversation_id, len(sent)) == sent
    # Every word is either in the prompt the upstream saw last, or found in an archived page.
    last_prompt = str(last_chat_prompt(emulator_8k, chat))
    missing = [w for w in chat.words if w not in last_prompt and not search_finds(proxy.url, chat, w)]
    assert not missing, missing
