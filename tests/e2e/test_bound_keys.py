"""Virtual keys bound to one end user (openai SDK -> proxy in auth_mode virtual_keys -> emulator).

The admin creates two keys of one tenant, one bound to Alice and one to Bob. Alice's key tells one conversation a
code; in a new conversation of hers, her question gets a round with that page of her other conversation. Bob's key
asking the same gets nothing of hers, even when its request names Alice (``user``, ``X-Memci-User``) or forges the
proxy's own header with her key: a key bound to a user IS that user.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.recall_client import labelled_metric
from tests.e2e.test_user_memory import PATIENT, chat, last_request, small_talk, tell

ADMIN = "adm-bound-keys-0123456789"
WINDOW = 4096
CODE = "bike lock combination is 7731-OTTER"


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW, {"MEMCI_CONTEXT_WINDOW": str(WINDOW), "MEMCI_AUTH_MODE": "virtual_keys",
                                       "MEMCI_ADMIN_KEY": ADMIN, **PATIENT})


def admin(proxy: Any, method: str, path: str, **kw: Any) -> httpx.Response:
    return httpx.request(method, proxy.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30, **kw)


def create_key(proxy: Any, user: str) -> dict[str, Any]:
    r = admin(proxy, "POST", "/memci/keys", json={"tenant": "family-app", "name": user, "user": user})
    assert r.status_code == 201, r.text
    return r.json()


def test_the_keys_api_binds_shows_the_hash_and_keeps_it(pair):
    for bad in (5, "", "x" * 513):
        r = admin(pair.proxy, "POST", "/memci/keys", json={"tenant": "family-app", "user": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "user"
    key = create_key(pair.proxy, "dora")
    plain = admin(pair.proxy, "POST", "/memci/keys", json={"tenant": "family-app"}).json()
    assert plain["user"] is None and key["user"].startswith("u") and "dora" not in key["user"]
    listed = {k["id"]: k["user"] for k in admin(pair.proxy, "GET", "/memci/keys").json()["data"]}
    assert listed[key["id"]] == key["user"] and listed[plain["id"]] is None
    assert admin(pair.proxy, "GET", f"/memci/keys/{key['id']}").json()["user"] == key["user"]
    rotated = admin(pair.proxy, "POST", f"/memci/keys/{key['id']}/rotate", json={})
    assert rotated.json()["user"] == key["user"]
    r = admin(pair.proxy, "PATCH", f"/memci/keys/{key['id']}", json={"user": "eve"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "user"  # a binding never changes


def test_a_key_bound_to_a_user_is_that_user(pair, client_for):
    alice_key, bob_key = create_key(pair.proxy, "alice"), create_key(pair.proxy, "bob")
    assert alice_key["tenant_id"] == bob_key["tenant_id"]
    assert alice_key["user"].startswith("u") and "alice" not in alice_key["user"]
    assert alice_key["user"] != bob_key["user"]
    alice = client_for(pair.proxy, api_key=alice_key["key"])
    bob = client_for(pair.proxy, api_key=bob_key["key"])

    # Alice's earlier conversation; the body names someone else: the key decides
    first_id = tell(alice, f"I bought a new bike. My {CODE}", "your bike lock combination", "2024-05-02",
                    user="carol")

    # a new conversation of hers: a few turns of something else, then the question
    system = {"role": "system", "content": "You are a helpful assistant. Today is 2024-05-20."}
    messages, second_id = small_talk(alice, system, "mountains", 4)
    assert second_id != first_id
    question = "What is my bike lock combination?"
    chat(alice, [*messages, {"role": "user", "content": question}])
    pushed = [m for m in last_request(pair.emulator, question)["messages"] if m.get("role") == "tool"]
    assert pushed and "7731-OTTER" in pushed[-1]["content"]

    # Bob's key: nothing of hers, whoever its request names
    forged = {"X-Memci-User": "alice", "X-Memci-Auth-User": alice_key["user"]}
    for extra in ({}, {"user": "alice", "safety_identifier": "alice"}, {"extra_headers": forged}):
        answer, _, _ = chat(bob, [system, {"role": "user", "content": question}], **extra)
        assert "7731" not in json.dumps(last_request(pair.emulator, question)) and "7731" not in answer
        headers = pair.emulator.turn_requests(1)[0]["headers"]
        assert "x-memci-auth-user" not in headers and "x-memci-user" not in headers  # never sent upstream
    assert "timeout" not in labelled_metric(pair.proxy, "memci_user_memory_pushes")  # each asking turn searched

    # the tenant's APIs: a bound key acts for its own user alone
    def as_alice(method: str, path: str, **kw: Any) -> httpx.Response:
        return httpx.request(method, pair.proxy.url + path, headers={"Authorization": f"Bearer {alice_key['key']}"},
                             timeout=30, **kw)

    own = as_alice("GET", "/memci/users/alice/conversations")
    assert own.status_code == 200 and {first_id, second_id} <= {c["id"] for c in own.json()["data"]}
    for method, path, kw in [("GET", "/memci/users/bob/conversations", {}), ("GET", "/memci/users/bob/export", {}),
                             ("DELETE", "/memci/users/bob", {}), ("GET", "/memci/conversations", {}),
                             ("GET", f"/memci/conversations/{first_id}/export", {}),
                             ("POST", "/memci/search", {"json": {"query": "bike lock", "user": "bob"}})]:
        r = as_alice(method, path, **kw)
        assert r.status_code == 403 and r.json()["error"]["code"] == "bound_key", (path, r.text)
