"""Tenant walls against real processes (proxy, PostgreSQL, Redis, emulator, a vision model).

Two tenants send byte-identical beginnings (the same system prompt, the same image, the same X-Session-Id), then
tenant A tells its conversations secrets (canary strings: in messages, in an image's bytes, in what the
summariser and the profile learn from them). Tenant B then tries every door: continuing the same prefix,
recalling by page number and by query, searching, listing, reading and deleting A's conversation, the admin
view without the admin key, a spoofed tenant header, a `memci-blob://` reference to A's image. No byte of a
canary may reach B: every answer B gets (status, headers, body, stream events) and every prompt the upstream
receives for B are scanned. Each door is also tried by A, where the canary must show (so the test can fail).
Last, A deletes its conversation: its rows, page vectors, its own image and its descriptions go; the image
B also sent stays.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg

from memci_proxy.blobs.store import description_blob_name, image_blob_name
from memci_proxy.turn.identity import key_tenant
from memci_proxy.store.sql.urls import to_libpq_url
from tests.resilience.conftest import FILLER
from tests.resilience.walls import Recorder, UpstreamLog, VisionStub, canary, image_message, png_with

ADMIN = "adm-walls-secret"
SYSTEM = {"role": "system", "content": "You are terse."}
SESSION = {"X-Session-Id": "the-same-session"}


def filler(turn: int, words: int = 300) -> str:
    return " ".join(FILLER[(turn + i) % len(FILLER)] for i in range(words))


class Conversation:
    def __init__(self, recorder: Recorder, headers: dict[str, str] | None = None) -> None:
        self.recorder = recorder
        self.headers = headers or {}
        self.messages: list[dict] = [SYSTEM]
        self.id: str | None = None
        self.archived = 0

    def say(self, message: dict | str, **extra) -> str:
        message = {"role": "user", "content": message} if isinstance(message, str) else message
        r = self.recorder.chat([*self.messages, message], headers=self.headers, **extra)
        assert r.status_code == 200, r.text
        if extra.get("stream"):
            answer = "".join(
                (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                for line in r.text.splitlines() if line.startswith("data: {")
            )
        else:
            answer = r.json()["choices"][0]["message"]["content"] or ""
        self.messages += [message, {"role": "assistant", "content": answer}]
        self.id = r.headers.get("x-memci-conversation-id", self.id)
        self.archived = int(r.headers.get("x-memci-pages-archived", "0"))
        return answer


def _rows_of(db_url: str, conversation_id: str) -> dict[str, int]:
    with psycopg.connect(to_libpq_url(db_url)) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE column_name = 'conversation_id' "
            "AND table_schema = 'public'").fetchall()]
        counts = {t: conn.execute(f'SELECT count(*) FROM "{t}" WHERE conversation_id = %s',  # noqa: S608
                                  (conversation_id,)).fetchone()[0] for t in tables}
        counts["conversations"] = conn.execute("SELECT count(*) FROM conversations WHERE id = %s",
                                               (conversation_id,)).fetchone()[0]
    return counts


def _wait_for(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.25)


def test_tenant_b_never_gets_anything_of_tenant_a(redis_proc, migrated_db_url, emulator_8k, home, start_proxy):
    vision = VisionStub()
    env = {"DATABASE_URL": migrated_db_url, "REDIS_URL": redis_proc.url, "MEMCI_ADMIN_KEY": ADMIN,
           "MEMCI_VISION_MODEL": "stub-vision", "MEMCI_VISION_URL": vision.base_url,
           "MEMCI_EMBEDDINGS_URL": "upstream", "MEMCI_EMBEDDINGS_PAGES": "archive", "MEMCI_MEMORY_WORKERS": "true", "MEMCI_CACHE_SALT_PER_TENANT": "true"}
    proxy = start_proxy(home / "p", env)
    blobs = home / "p" / "blobs"
    upstream = UpstreamLog(emulator_8k)
    a_key, b_key = "sk-walls-tenant-a-0001", "sk-walls-tenant-b-0002"
    a_tenant, b_tenant = key_tenant(a_key), key_tenant(b_key)
    a, b, admin = Recorder(proxy.url, a_key), Recorder(proxy.url, b_key), Recorder(proxy.url, ADMIN)
    shared_uri, shared_key, _ = png_with("the shared architecture diagram")
    fact, secret_image = canary("Fact"), canary("Image")
    a_image_uri, a_image_key, a_image_bytes = png_with(f"a whiteboard reading {secret_image}")
    secrets_of_a = [canary(f"Turn{i}") for i in range(14)]
    b_word = canary("TenantB")  # in every later message of B: finds the upstream prompts sent for B
    everything_of_a = [*secrets_of_a, fact, secret_image, a_key]

    try:
        # -- 1. the same beginning, the same session id, the same image -----------------------------------------
        a_session, b_session = Conversation(a, SESSION), Conversation(b, SESSION)
        a_prefix, b_prefix = Conversation(a), Conversation(b)  # identified by their messages (no session id)
        for conversation in (a_session, b_session):
            conversation.say(image_message("Here is our architecture diagram. [[len:30]]", shared_uri))
            conversation.say("What do you think of it? [[len:30]]")
        for conversation in (a_prefix, b_prefix):
            conversation.say("Let us plan the migration. [[len:30]]")
        assert a_session.id != b_session.id and a_session.id and b_session.id

        # -- 2. A's secrets, until pages are archived (summaries and profile facts are made from them) -----------
        for i, secret in enumerate(secrets_of_a):
            # the marker first: the summariser reads the head of each message (the emulator answers it)
            text = f"[[say:- profile fact {fact}]] Turn {i}: the vault code is {secret}. {filler(i)}"
            a_session.say(image_message(text, a_image_uri) if i == 2 else text)
            a_prefix.say(f"Prefix turn {i}: remember {secret}. {filler(i + 5)} [[len:30]]")
        assert a_session.archived > 0 and a_prefix.archived > 0
        a_session.say('Find the vault codes. [[call:recall {"query": "vault code"}]]')  # page vectors made

        # -- 3. B's own turns: the first names A's image by reference ---------------------------------------------
        forged = f"memci-blob://sha256/{a_image_key}?type=image/png&size={len(a_image_bytes)}"
        for i in range(14):
            text = f"B turn {i} {b_word}. {filler(i + 3)} [[len:30]]"
            b_session.say(image_message(text, forged) if i == 0 else text, stream=i % 3 == 0)
            b_prefix.say(f"B prefix turn {i} {b_word}. {filler(i + 7)} [[len:30]]")
        assert b_session.archived > 0 and b_prefix.archived > 0
        assert b_prefix.id != a_prefix.id  # the same first messages: still B's own conversation

        # -- 4. every door, tried by B ------------------------------------------------------------------------------
        answer = b_session.say(f'{b_word} recall. [[call:recall {{"pages": [1, 2, 3, 4, 5, 6]}}]]')
        assert answer.startswith("Tool result: [Page 1]")  # the recall ran (the emulator echoes its result)
        # B's guesses name what A's pages say ("vault code"), never the canaries themselves (B would echo them)
        b_session.say(f'{b_word} search. [[call:recall {{"query": "vault code profile fact whiteboard"}}]]',
                      stream=True)
        assert b_prefix.say(f'{b_word} recall. [[call:recall {{"pages": [1, 2, 3, 4, 5]}}]]').startswith("Tool result")
        for query, conversation in (("vault code", a_session.id), ("vault code", a_prefix.id)):
            r = b.request("POST", "/memci/search", json={"query": query, "conversation_id": conversation})
            assert r.status_code == 404, r.text
        r = b.request("POST", "/memci/search", json={"query": "vault code whiteboard",
                                                    "session_key": SESSION["X-Session-Id"]})
        assert r.status_code == 200 and r.json()["conversation_id"] == b_session.id
        listed = b.request("GET", "/memci/conversations").json()["data"]
        assert {c["id"] for c in listed} == {b_session.id, b_prefix.id}
        for path in (f"/memci/conversations/{a_session.id}", f"/memci/conversations/{a_session.id}/export"):
            assert b.request("GET", path).status_code == 404
        assert b.request("GET", f"/memci/conversations/{a_session.id}/prompt").status_code == 401
        assert b.request("GET", f"/memci/conversations/{a_session.id}/prompt",
                         headers={"X-Memci-Tenant": a_tenant}).status_code == 401
        spoofed = b.request("GET", "/memci/conversations", headers={"X-Memci-Auth-Tenant": a_tenant,
                                                                     "X-Memci-Tenant": a_tenant})
        assert {c["id"] for c in spoofed.json()["data"]} == {b_session.id, b_prefix.id}
        assert b.request("DELETE", f"/memci/conversations/{a_session.id}").status_code == 404
        for path in (f"/memci/conversations/{b_session.id}", f"/memci/conversations/{b_session.id}/export"):
            assert b.request("GET", path).status_code == 200
        nobody = Recorder(proxy.url, "")
        assert nobody.request("GET", f"/memci/conversations/{a_session.id}/prompt").status_code == 401
        nobody.close()

        # -- 5. the same doors for A show A's secrets (the canaries are findable) ---------------------------------
        _wait_for(lambda: len(vision.images) >= 3, what="the image descriptions")
        answer = a_session.say('Recall. [[call:recall {"pages": [3, 5]}]]')  # turn 0, and turn 2 with A's image
        assert fact in answer  # the emulator obeys the [[say:]] marker of A's recalled page
        r = a.request("POST", "/memci/search", json={"query": f"vault {secrets_of_a[1]}", "conversation_id": a_session.id})
        assert secrets_of_a[1] in r.text
        assert secrets_of_a[0] in a.request("GET", f"/memci/conversations/{a_session.id}").text
        r = admin.request("GET", f"/memci/conversations/{a_session.id}/prompt")
        assert r.status_code == 200 and secrets_of_a[-1] in r.text
        assert any(s in "\n".join(a.answers) for s in secrets_of_a)

        def summary_learnt() -> bool:
            with psycopg.connect(to_libpq_url(migrated_db_url)) as conn:
                facts = conn.execute("SELECT count(*) FROM memory_profile_facts WHERE tenant = %s AND fact LIKE %s",
                                     (a_tenant, f"%{fact}%")).fetchone()[0]
                summaries = conn.execute("SELECT count(*) FROM memory_summaries WHERE conversation_id = %s AND "
                                         "text LIKE %s", (a_session.id, f"%{fact}%")).fetchone()[0]
            return facts > 0 and summaries > 0

        _wait_for(summary_learnt, what="A's summary and profile facts")
        for i in range(4):  # B goes on past a compaction epoch: its profile and summary are refreshed
            b_session.say(f"B more {i} {b_word}. {filler(i + 11)} [[len:30]]")

        # -- 6. nothing of A reached B --------------------------------------------------------------------------------
        assert b.leaks(everything_of_a) == []
        b_prompts = upstream.bodies_with(b_word)
        assert len(b_prompts) > 30
        assert [c for c in everything_of_a if any(c in p for p in b_prompts)] == []
        assert any("no description available" in p and a_image_key in p for p in b_prompts)  # the forged image
        a_prompts = [p for p in upstream.bodies_with("vault code") if b_word not in p]
        assert any(secret_image in p for p in a_prompts)  # A's own image description reached A's prompts
        assert [img for img in vision.images if secret_image.encode() in img] == [a_image_bytes]  # for A only
        assert sum(1 for img in vision.images if b"shared architecture" in img) == 2  # once per tenant
        assert proxy.log().count(secrets_of_a[0]) == 0

        # -- 7. A deletes its conversation: what only it referenced goes ---------------------------------------------
        for tenant, key in ((a_tenant, shared_key), (a_tenant, a_image_key), (b_tenant, shared_key)):
            assert (blobs / description_blob_name(key, tenant)).exists()
        assert (blobs / image_blob_name(a_image_key)).exists()
        def vectors_of_a() -> bool:  # archived pages are embedded in the background, after their turn
            with psycopg.connect(to_libpq_url(migrated_db_url)) as conn:
                return conn.execute("SELECT count(*) FROM memory_vectors WHERE conversation_id = %s",
                                    (a_session.id,)).fetchone()[0] > 0

        _wait_for(vectors_of_a, what="the vectors of A's archived pages")
        r = a.request("DELETE", f"/memci/conversations/{a_session.id}")
        assert r.status_code == 200, r.text
        erased = r.json()
        assert erased["deleted"] and erased["page_vectors"] > 0
        assert erased["images_deleted"] == 1 and erased["images_kept"] == 1 and erased["images_failed"] == 0
        assert not (blobs / image_blob_name(a_image_key)).exists()
        assert (blobs / image_blob_name(shared_key)).exists()  # B sent the same bytes
        assert not (blobs / description_blob_name(a_image_key, a_tenant)).exists()
        assert not (blobs / description_blob_name(shared_key, a_tenant)).exists()  # no other conversation of A has it
        assert (blobs / description_blob_name(shared_key, b_tenant)).exists()
        assert sum(_rows_of(migrated_db_url, a_session.id).values()) == 0
        assert a.request("GET", f"/memci/conversations/{a_session.id}").status_code == 404
        assert sum(_rows_of(migrated_db_url, b_session.id).values()) > 0
        b_session.say(f"Still here {b_word}? [[len:20]]")
    finally:
        for recorder in (a, b, admin):
            recorder.close()
        vision.close()


def test_blob_files_live_under_the_blob_root(home: Path) -> None:
    """The names the test above checks are the ones the store writes (one place decides them)."""
    key = "ab" * 32
    assert image_blob_name(key).startswith("images/sha256/ab/")
    assert description_blob_name(key, "t1").startswith("descriptions/t") and description_blob_name(key, "t1") != \
        description_blob_name(key, "t2")
