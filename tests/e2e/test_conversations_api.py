"""Conversation APIs: list, history with pages, export, delete (every table, the hot state), tenant scoping."""

from __future__ import annotations

import httpx
import openai
import pytest


ADMIN = "admin-key"


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096, {"MEMCI_ADMIN_KEY": ADMIN})


@pytest.fixture(scope="module")
def conversation(proxy):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-owner", max_retries=0)
    messages: list[dict] = []
    for turn in range(40):
        messages.append({"role": "user", "content": f"Turn {turn}: tell me about item {turn}. [[len:80]]"})
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=100)
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
    assert int(raw.headers["x-memci-pages-archived"]) > 0
    return raw.headers["x-memci-conversation-id"], messages


def get(proxy, path, key="sk-owner", **kw):
    return httpx.get(proxy.url + path, headers={"Authorization": f"Bearer {key}", **kw.pop("headers", {})}, timeout=10, **kw)


def test_list_and_history(proxy, conversation):
    cid, messages = conversation
    listed = get(proxy, "/memci/conversations").json()["data"]
    assert cid in [c["id"] for c in listed]
    history = get(proxy, f"/memci/conversations/{cid}", params={"limit": 1000}).json()
    assert [m["message"]["content"] for m in history["messages"]] == [m["content"] for m in messages[:-1]]
    states = {m["state"] for m in history["messages"]}
    assert {"archived", "active"} <= states
    assert history["messages"][0]["page"] == "1"
    first = get(proxy, f"/memci/conversations/{cid}", params={"limit": 10}).json()
    assert len(first["messages"]) == 10 and first["next_after"] == 9


def test_other_tenants_see_nothing(proxy, conversation):
    cid, _ = conversation
    assert get(proxy, f"/memci/conversations/{cid}", key="sk-intruder").status_code == 404
    assert cid not in [c["id"] for c in get(proxy, "/memci/conversations", key="sk-intruder").json()["data"]]


def test_export(proxy, conversation):
    cid, messages = conversation
    data = get(proxy, f"/memci/conversations/{cid}/export").json()
    assert data["conversation"]["id"] == cid
    assert len(data["messages"]) == len(messages) - 1
    assert any(p["state"] == "archived" for p in data["pages"])


def test_delete_removes_everything(proxy, emu):
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-deleter", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "short-lived [[len:5]]"}], max_tokens=20)
    cid = raw.headers["x-memci-conversation-id"]
    r = httpx.delete(proxy.url + f"/memci/conversations/{cid}", headers={"Authorization": "Bearer sk-deleter"})
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert get(proxy, f"/memci/conversations/{cid}", key="sk-deleter").status_code == 404
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "short-lived [[len:5]]"}], max_tokens=20)
    assert raw.headers["x-memci-conversation-id"] != cid  # nothing left to continue


def test_admin_acts_for_a_named_tenant(proxy, conversation):
    cid, _ = conversation
    no_tenant = get(proxy, "/memci/conversations", key=ADMIN)
    assert no_tenant.status_code == 400


def test_delete_removes_the_responses_chain(proxy, emu):
    """previous_response_id of a deleted conversation is a 404, not a replay of the deleted text upstream."""
    client = openai.OpenAI(base_url=proxy.base_url, api_key="sk-chain-deleter", max_retries=0)
    first = client.responses.create(model="m", input="remember the word zanzibar [[len:5]]")
    raw = client.responses.with_raw_response.create(model="m", input="and now? [[len:5]]",
                                                    previous_response_id=first.id)
    cid, second = raw.headers["x-memci-conversation-id"], raw.parse()
    r = httpx.delete(proxy.url + f"/memci/conversations/{cid}", headers={"Authorization": "Bearer sk-chain-deleter"})
    assert r.status_code == 200 and r.json()["deleted"] is True
    last = emu.turn_requests(1)[0]
    for gone in (first.id, second.id):
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(model="m", input="continue", previous_response_id=gone)
        assert missing.value.body["code"] == "previous_response_not_found"
    assert emu.turn_requests(1)[0] == last  # nothing went upstream
