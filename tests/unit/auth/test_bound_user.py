"""Virtual keys bound to one end user: the middleware carries the user's keyed hash in a proxy-owned header (a
client's own copy never survives, nor reaches the upstream), and the turn takes it as the request's end user."""

from __future__ import annotations

import json

import pytest

from memci_proxy.api.auth import AuthMiddleware, Authenticator, parse_virtual_keys, virtual_tenant
from memci_proxy.settings import Settings, SettingsError
from memci_proxy.turn.call import chat_call
from memci_proxy.turn.end_user import AUTH_USER_HEADER, user_key
from memci_proxy.turn.identity import AUTH_TENANT_HEADER
from memci_proxy.upstream.client import UpstreamClient

KEYS = {"sk-alice-key": {"tenant": "acme", "user": "alice"}, "sk-app-key": {"tenant": "acme"}}
MESSAGES = [{"role": "user", "content": "hi"}]
HEADER = AUTH_USER_HEADER.encode()


def authenticator() -> Authenticator:
    return Authenticator(Settings(auth_mode="virtual_keys", virtual_keys=json.dumps(KEYS), admin_key="adm-secret",
                                  user_hash_key="deploy-secret"))


async def through(auth: Authenticator, path: str, headers: dict[str, str]) -> dict[bytes, bytes] | None:
    seen: dict[str, dict[bytes, bytes]] = {}

    async def app(scope, receive, send):
        seen["headers"] = dict(scope["headers"])

    async def send(message):
        pass

    scope = {"type": "http", "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    await AuthMiddleware(app, auth)(scope, None, send)
    return seen.get("headers")


async def test_a_bound_key_carries_its_users_keyed_hash():
    seen = await through(authenticator(), "/v1/chat/completions", {"authorization": "Bearer sk-alice-key"})
    alice = user_key(virtual_tenant("acme"), "alice", "deploy-secret")
    assert seen[HEADER] == alice.encode() and b"alice" not in seen[HEADER]
    assert seen[AUTH_TENANT_HEADER.encode()] == virtual_tenant("acme").encode()


@pytest.mark.parametrize("key, path", [("sk-app-key", "/v1/chat/completions"), ("sk-alice-key", "/v1/models"),
                                       ("adm-secret", "/memci/conversations"), ("", "/health")])
async def test_a_clients_own_copy_of_the_header_is_always_dropped(key, path):
    forged = user_key(virtual_tenant("acme"), "bob", "deploy-secret")
    headers = {AUTH_USER_HEADER: forged, "X-Memci-Auth-User": forged}
    if key:
        headers["authorization"] = f"Bearer {key}"
    seen = await through(authenticator(), path, headers)
    assert forged.encode() not in seen.values()
    if key != "sk-alice-key":
        assert HEADER not in seen


def test_the_header_never_goes_upstream():
    client = UpstreamClient(Settings())
    out = client.forward_headers({"X-Memci-Auth-User": "u123", "x-memci-auth-user": "u123", "accept": "x"})
    assert out == {"accept": "x"}


def test_the_call_takes_the_bound_user_over_every_id_the_request_names():
    bound = user_key(virtual_tenant("acme"), "alice", "s")
    headers = {AUTH_USER_HEADER: bound, "X-Memci-User": "bob"}
    call = chat_call(headers, {"messages": MESSAGES, "user": "carol", "safety_identifier": "dave"}, b"{}", None,
                     tenant=virtual_tenant("acme"), user_secret="s")
    assert call.end_user == bound
    # an id that could not be one does not matter either: the key names the user
    assert chat_call(headers, {"messages": MESSAGES, "user": 5}, b"{}", None, tenant="t", user_secret="s"
                     ).end_user == bound
    unbound = chat_call({"X-Memci-User": "bob"}, {"messages": MESSAGES}, b"{}", None, tenant="t", user_secret="s")
    assert unbound.end_user == user_key("t", "bob", "s")


def test_settings_keys_take_an_optional_user():
    parsed = parse_virtual_keys(json.dumps(KEYS))
    assert sorted(k.user for k in parsed.values()) == ["", "alice"]
    for bad in ({"tenant": "acme", "user": 5}, {"tenant": "acme", "user": "x" * 600}):
        with pytest.raises(SettingsError, match="'user'"):
            parse_virtual_keys(json.dumps({"sk-k": bad}))
