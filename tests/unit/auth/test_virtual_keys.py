"""Virtual keys: parsing, identity resolution, header rewriting, cache salt."""

import json

import msgspec
import pytest

from memci_proxy.api.auth import (
    AuthMiddleware,
    Authenticator,
    cache_salt_of,
    parse_virtual_keys,
    virtual_tenant,
    with_cache_salt,
)
from memci_proxy.turn.identity import AUTH_TENANT_HEADER, key_tenant, tenant_of
from memci_proxy.settings import Settings, SettingsError

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


async def test_resolve_maps_keys_to_tenants_and_upstream_keys():
    auth = authenticator()
    alice = await auth.resolve({"authorization": "Bearer sk-alice"})
    assert (alice.tenant, alice.upstream_key) == (virtual_tenant("acme"), "up-acme")
    bob = await auth.resolve({"Authorization": "Bearer sk-bob"})
    assert (bob.tenant, bob.upstream_key) == (virtual_tenant("globex"), "")
    for headers in ({"authorization": "Bearer sk-eve"}, {}, {"authorization": "Bearer "}):
        with pytest.raises(Exception) as info:
            await auth.resolve(headers)
        assert info.value.status == 401 and info.value.code == "invalid_api_key"


def test_virtual_mode_with_only_an_admin_key_starts_empty():
    auth = Authenticator(Settings(auth_mode="virtual_keys", admin_key="adm"))
    assert auth.seeds == {}


def test_admin_key_comparison():
    from memci_proxy.api.auth import is_admin_key

    assert is_admin_key("adm-secret", "adm-secret")
    assert not is_admin_key("adm-secre", "adm-secret") and not is_admin_key("", "adm-secret")
    assert not is_admin_key("adm-secret", "")


async def test_passthrough_tenant_is_the_key_hash():
    auth = Authenticator(Settings())
    identity = await auth.resolve({"authorization": "Bearer sk-x"})
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


async def test_middleware_marks_the_admin_key_drops_it_and_drops_spoofed_tenants():
    auth = authenticator(admin_key="adm")
    seen, _ = await _through(auth, "/memci/conversations", {"authorization": "Bearer adm", AUTH_TENANT_HEADER: "x"})
    assert b"authorization" not in seen and AUTH_TENANT_HEADER.encode() not in seen
    assert b"adm" not in b"".join(seen.values())
    seen, _ = await _through(auth, "/health", {AUTH_TENANT_HEADER: "x"})
    assert AUTH_TENANT_HEADER.encode() not in seen


@pytest.mark.parametrize("mode", ["virtual_keys", "passthrough"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/v1/embeddings"])
async def test_the_admin_key_is_refused_on_v1_like_an_unknown_key_in_every_mode(mode, path):
    auth = Authenticator(Settings(auth_mode=mode, virtual_keys=json.dumps(KEYS), admin_key="adm"))
    seen, sent = await _through(auth, path, {"authorization": "Bearer adm"})
    assert seen is None
    assert sent[0]["status"] == 401
    assert msgspec.json.decode(sent[1]["body"])["error"] == msgspec.json.decode(
        (await _through(authenticator(), path, {"authorization": "Bearer sk-eve"}))[1][1]["body"])["error"]


@pytest.mark.parametrize("where", [{"x-api-key": "adm-secret-key"}, {"api-key": "Bearer adm-secret-key"}])
async def test_the_admin_key_in_another_header_or_the_query_is_refused_on_v1_too(where):
    auth = Authenticator(Settings(admin_key="adm-secret-key"))
    seen, sent = await _through(auth, "/v1/chat/completions", {"authorization": "Bearer sk-client-1", **where})
    assert seen is None and sent[0]["status"] == 401
    app_seen = {}

    async def app(scope, receive, send):
        app_seen["ok"] = True

    scope = {"type": "http", "path": "/v1/models", "query_string": b"api_key=adm-secret-key", "headers": []}
    statuses = []

    async def send(message):
        statuses.append(message.get("status"))

    await AuthMiddleware(app, auth)(scope, None, send)
    assert not app_seen and statuses[0] == 401


@pytest.mark.parametrize("setting", ["upstream_api_key", "summary_model_api_key", "vision_api_key",
                                     "rewrite_model_api_key", "embeddings_api_key"])
def test_no_upstream_key_may_be_the_admin_key(setting):
    with pytest.raises(SettingsError, match=setting):
        Authenticator(Settings(admin_key="adm", **{setting: "adm"}))


@pytest.mark.parametrize("keys", [{"adm": {"tenant": "acme"}}, {"sk-a": {"tenant": "acme", "upstream_key": "adm"}}])
def test_no_virtual_key_nor_its_upstream_key_may_be_the_admin_key(keys):
    with pytest.raises(SettingsError, match="admin_key"):
        Authenticator(Settings(auth_mode="virtual_keys", virtual_keys=json.dumps(keys), admin_key="adm"))


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


def test_log_redaction_hides_configured_secrets_and_key_shapes():
    import logging

    from memci_proxy.log_redaction import RedactSecrets

    redactor = RedactSecrets(["adm-secret-1", "up-acme-key"])
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "key %s and %s, header %s", (
        "adm-secret-1", "up-acme-key", "Authorization: Bearer abc.def"), None)
    assert redactor.filter(record)
    text = record.getMessage()
    assert "adm-secret-1" not in text and "up-acme-key" not in text and "abc.def" not in text
    assert text.count("[redacted]") == 3
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "client sent sk-live-0123456789abcdef", (), None)
    redactor.filter(record)
    assert "0123456789" not in record.getMessage()


def test_key_hints_show_the_ends_only():
    from memci_proxy.keys import key_hint, new_secret

    secret = new_secret()
    hint = key_hint(secret)
    assert hint.startswith("sk-memci-") and hint.endswith(secret[-4:]) and len(hint) < 20 and secret not in hint
    assert key_hint("short") == "sh…"


async def test_a_key_over_its_budget_gets_429_insufficient_quota_and_usage_is_charged():
    from memci_proxy import usage_meter
    from memci_proxy.keys import VirtualKey, key_digest

    auth = authenticator()
    charged = []
    auth.keys.charge = lambda vk, tokens: charged.append((vk.id, tokens))
    digest = key_digest("sk-alice")
    auth.keys.static[digest] = VirtualKey("k1", virtual_tenant("acme"), "acme", "up-acme", digest,
                                          budget_tokens=100, used_tokens=40)

    async def app(scope, receive, send):
        usage_meter.record({"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25})
        usage_meter.record({"prompt_tokens": 10, "completion_tokens": 1})

    sent = []

    async def send(message):
        sent.append(message)

    def scope():
        return {"type": "http", "path": "/v1/chat/completions", "headers": [(b"authorization", b"Bearer sk-alice")]}

    await AuthMiddleware(app, auth)(scope(), None, send)
    assert charged == [("k1", 36)] and sent == []
    auth.keys.static[digest] = VirtualKey("k1", virtual_tenant("acme"), "acme", "up-acme", digest,
                                          budget_tokens=100, used_tokens=100)
    await AuthMiddleware(app, auth)(scope(), None, send)
    assert sent[0]["status"] == 429
    error = msgspec.json.decode(sent[1]["body"])["error"]
    assert error["code"] == "insufficient_quota" and error["type"] == "insufficient_quota"
    assert len(charged) == 1
