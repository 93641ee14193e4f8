"""Virtual keys: parsing, identity resolution, header rewriting, cache salt."""

import json

import msgspec
import pytest

from proxy.api.auth import (
    AuthMiddleware,
    Authenticator,
    cache_salt_of,
    parse_virtual_keys,
    virtual_tenant,
    with_cache_salt,
)
from proxy.turn.identity import AUTH_TENANT_HEADER, key_tenant, tenant_of
from proxy.settings import Settings, SettingsError

KEYS = {"sk-alice": {"tenant": "acme", "upstream_key": "up-acme"}, "sk-bob": {"tenant": "globex", "upstream_key": ""}}


def authenticator(**kw) -> Authenticator:
    return Authenticator(Settings(auth_mode="virtual_keys", virtual_keys=json.dumps(KEYS), **kw))


def test_json_inline_toml_inline_and_file_give_the_same_mapping(tmp_path):
    from_json = parse_virtual_keys(json.dumps(KEYS))
    toml = '[keys."sk-alice"]\ntenant = "acme"\nupstream_key = "up-acme"\n[keys."sk-bob"]\ntenant = "globex"\n'
    assert parse_virtual_keys(toml) == from_json
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": KEYS}))
    assert parse_virtual_keys(str(path)) == from_json
    assert len(from_json) == 2


def test_the_mapping_never_holds_the_client_keys():
    mapping = parse_virtual_keys(json.dumps(KEYS))
    assert "sk-alice" not in repr(mapping)


@pytest.mark.parametrize("bad", ['{"k": {"upstream_key": "x"}}', '{"k": "acme"}', "not json = [", "/no/such/file.json"])
def test_bad_virtual_keys_fail_with_the_setting_named(bad):
    with pytest.raises(SettingsError, match="virtual_keys"):
        parse_virtual_keys(bad)


def test_virtual_mode_without_keys_fails_at_start():
    with pytest.raises(SettingsError):
        Authenticator(Settings(auth_mode="virtual_keys"))


def test_resolve_maps_keys_to_tenants_and_upstream_keys():
    auth = authenticator()
    alice = auth.resolve({"authorization": "Bearer sk-alice"})
    assert (alice.tenant, alice.upstream_key) == (virtual_tenant("acme"), "up-acme")
    bob = auth.resolve({"Authorization": "Bearer sk-bob"})
    assert (bob.tenant, bob.upstream_key) == (virtual_tenant("globex"), "")
    for headers in ({"authorization": "Bearer sk-eve"}, {}, {"authorization": "Bearer "}):
        with pytest.raises(Exception) as info:
            auth.resolve(headers)
        assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_passthrough_tenant_is_the_key_hash():
    auth = Authenticator(Settings())
    identity = auth.resolve({"authorization": "Bearer sk-x"})
    assert identity.tenant == key_tenant("sk-x") == tenant_of({"authorization": "Bearer sk-x"})
    assert identity.upstream_key is None


async def _through(middleware_auth, path, headers):
    seen = {}

    async def app(scope, receive, send):
        seen["headers"] = dict(scope["headers"])

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
    await AuthMiddleware(app, middleware_auth)(scope, None, send)
    return seen.get("headers"), sent


async def test_middleware_replaces_the_client_key_and_sets_the_tenant():
    seen, _ = await _through(authenticator(), "/v1/chat/completions",
                             {"authorization": "Bearer sk-alice", AUTH_TENANT_HEADER: "spoofed"})
    assert seen[b"authorization"] == b"Bearer up-acme"
    assert seen[AUTH_TENANT_HEADER.encode()] == virtual_tenant("acme").encode()
    assert b"sk-alice" not in b"".join(seen.values())


async def test_middleware_drops_the_key_when_the_virtual_key_has_no_upstream_key():
    seen, _ = await _through(authenticator(), "/v1/models", {"authorization": "Bearer sk-bob"})
    assert b"authorization" not in seen


async def test_middleware_answers_401_for_an_unknown_key():
    seen, sent = await _through(authenticator(), "/v1/chat/completions", {"authorization": "Bearer sk-eve"})
    assert seen is None
    assert sent[0]["status"] == 401
    assert msgspec.json.decode(sent[1]["body"])["error"]["code"] == "invalid_api_key"


async def test_middleware_passes_the_admin_key_and_unguarded_paths_but_drops_spoofed_tenants():
    auth = authenticator(admin_key="adm")
    seen, _ = await _through(auth, "/memci/conversations", {"authorization": "Bearer adm", AUTH_TENANT_HEADER: "x"})
    assert seen[b"authorization"] == b"Bearer adm" and AUTH_TENANT_HEADER.encode() not in seen
    seen, _ = await _through(auth, "/health", {AUTH_TENANT_HEADER: "x"})
    assert AUTH_TENANT_HEADER.encode() not in seen


def test_cache_salt_is_spliced_without_touching_the_messages_bytes():
    body = b'{ "messages" :[{"role":"user","content":"hi"}],"model":"m"}'
    data = msgspec.json.decode(body)
    new_body, new_data = with_cache_salt(body, data, "tA")
    assert b'"messages" :[{"role":"user","content":"hi"}]' in new_body
    assert msgspec.json.decode(new_body)["cache_salt"] == "tA" == new_data["cache_salt"]


def test_a_client_salt_stays_inside_the_tenant_salt():
    data = {"messages": [], "cache_salt": "mine"}
    new_body, new_data = with_cache_salt(msgspec.json.encode(data), data, "tA")
    assert new_data["cache_salt"] == cache_salt_of("tA", "mine") != cache_salt_of("tB", "mine")
    assert new_data["cache_salt"].startswith("tA:")
    assert msgspec.json.decode(new_body)["cache_salt"] == new_data["cache_salt"]
