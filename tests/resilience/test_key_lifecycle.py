"""Virtual keys through their whole life against real processes: two proxy replicas sharing PostgreSQL (with and
without Redis), the official openai SDK as the client.

Created on one replica, a key works on the other; listings never show a secret; its own rate limit answers 429
with Retry-After; its token budget, counted from the upstream's reported usage, answers 429
``insufficient_quota`` once spent; rotation replaces the secret (with an optional grace period); revocation on
one replica is refused by the other within a second. A key from the settings is seeded and listed. The proxy's
log holds no key and no prompt, unless prompt logging is switched on.
"""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.resilience.walls import canary

ADMIN = "adm-keys-secret-0123"
SETTINGS_KEY = "sk-from-settings-0123456789"


def sdk(proxy, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0, timeout=30)


def ask(client: openai.OpenAI, text: str = "hello [[len:20]]"):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], max_tokens=32)


def admin(proxy, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, proxy.url + path, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30, **kw)


def refused_within(proxy, key: str, limit_s: float) -> float:
    """Seconds from now until the first request that is refused was sent (its own time on a busy machine is not the
    replicas' delay in learning of the change)."""
    started = time.monotonic()
    client = sdk(proxy, key)
    try:
        while True:
            sent = time.monotonic()
            try:
                ask(client)
            except openai.AuthenticationError as exc:
                assert exc.status_code == 401 and exc.code == "invalid_api_key"
                return sent - started
            assert sent - started < limit_s, "the revoked key still works"
            time.sleep(0.02)
    finally:
        client.close()


def _env(db_url: str, redis_url: str = "", **extra: str) -> dict[str, str]:
    env = {"DATABASE_URL": db_url, "MEMCI_AUTH_MODE": "virtual_keys", "MEMCI_ADMIN_KEY": ADMIN,
           "MEMCI_VIRTUAL_KEYS": json.dumps({SETTINGS_KEY: {"tenant": "seeded", "upstream_key": "sk-up-seeded"}}),
           **extra}
    if redis_url:
        env["REDIS_URL"] = redis_url
    return env


@pytest.mark.parametrize("with_redis", [True, False], ids=["redis", "no-redis"])
def test_a_key_from_birth_to_revocation_on_two_replicas(with_redis, request, migrated_db_url, home, start_proxy):
    redis_url = request.getfixturevalue("redis_proc").url if with_redis else ""
    one = start_proxy(home / "one", _env(migrated_db_url, redis_url))
    two = start_proxy(home / "two", _env(migrated_db_url, redis_url))

    # the settings' key is seeded, works, and is listed without its secret
    assert ask(sdk(two, SETTINGS_KEY)).choices[0].message.content
    listed = admin(one, "GET", "/memci/keys").json()["data"]
    assert [k["source"] for k in listed] == ["settings"] and SETTINGS_KEY not in json.dumps(listed)
    assert "sk-up-seeded" not in json.dumps(listed)

    # created on one replica, used on the other
    r = admin(one, "POST", "/memci/keys", json={"tenant": "acme", "name": "ci", "upstream_key": "sk-up-acme-999",
                                                 "rate_limit_rps": 2, "rate_limit_burst": 3})
    assert r.status_code == 201, r.text
    created = r.json()
    secret, key_id = created["key"], created["id"]
    assert secret.startswith("sk-memci-") and created["key_hint"].endswith(secret[-4:])
    client = sdk(two, secret)
    assert ask(client).choices[0].message.content
    listing = admin(two, "GET", "/memci/keys").text
    assert secret not in listing and "sk-up-acme-999" not in listing and key_id in listing
    assert admin(two, "GET", f"/memci/keys/{key_id}").json()["upstream_key_hint"] == "sk-u…-999"
    assert httpx.get(one.url + "/memci/keys", headers={"Authorization": f"Bearer {secret}"}).status_code == 401

    # its own rate limit: a burst of 3, then 429 with Retry-After
    statuses = []
    for _ in range(6):
        try:
            ask(client)
            statuses.append(200)
        except openai.RateLimitError as exc:
            statuses.append(exc.status_code)
            assert exc.response.headers.get("retry-after") and exc.code == "rate_limit_exceeded"
    assert 429 in statuses and statuses[0] == 200

    # a budget in tokens, counted from the upstream's usage
    r = admin(one, "PATCH", f"/memci/keys/{key_id}", json={"rate_limit_rps": None, "budget_tokens": 150,
                                                           "used_tokens": 0})
    assert r.status_code == 200 and r.json()["budget_tokens"] == 150
    time.sleep(1.0)  # a change reaches the other replica within a second
    budget_client = sdk(two, secret)
    spent = 0
    deadline = time.monotonic() + 20
    while True:
        try:
            usage = ask(budget_client, "spend [[len:30]]").usage
            spent += usage.total_tokens
        except openai.RateLimitError as exc:
            assert exc.status_code == 429 and exc.code == "insufficient_quota", exc
            break
        except openai.AuthenticationError:
            raise
        assert time.monotonic() < deadline, "the budget never ran out"
        time.sleep(0.05)
    assert spent >= 150
    time.sleep(0.5)  # usage is written behind the answer
    assert admin(one, "GET", f"/memci/keys/{key_id}").json()["used_tokens"] >= 150
    assert admin(one, "PATCH", f"/memci/keys/{key_id}", json={"budget_tokens": None}).status_code == 200

    # rotation: the new secret works at once; the old one during its grace period only
    time.sleep(1.0)
    r = admin(one, "POST", f"/memci/keys/{key_id}/rotate", json={"grace_seconds": 30})
    assert r.status_code == 200, r.text
    rotated = r.json()["key"]
    assert rotated != secret and ask(sdk(two, rotated)).choices[0].message.content
    assert ask(sdk(two, secret)).choices[0].message.content  # grace
    r = admin(one, "POST", f"/memci/keys/{key_id}/rotate", json={})
    newest = r.json()["key"]
    assert refused_within(two, rotated, 1.0) <= 1.0 and refused_within(two, secret, 1.0) <= 1.0

    # revocation: refused on the other replica within a second
    assert ask(sdk(two, newest)).choices[0].message.content
    r = admin(one, "POST", f"/memci/keys/{key_id}/revoke")
    assert r.status_code == 200 and r.json()["revoked_at"]
    took = refused_within(two, newest, 1.0)
    assert took <= 1.0
    assert key_id not in admin(one, "GET", "/memci/keys").text
    assert key_id in admin(one, "GET", "/memci/keys?include_revoked=true").text
    assert admin(one, "POST", f"/memci/keys/{key_id}/rotate").status_code == 409
    assert admin(one, "GET", "/memci/keys/key_nope").status_code == 404
    assert admin(one, "POST", "/memci/keys", json={"tenant": ""}).status_code == 400
    assert admin(one, "POST", "/memci/keys", json={"tenant": "x", "budget_tokens": -1}).status_code == 400

    for proxy in (one, two):
        log = proxy.log()
        for secret_text in (secret, rotated, newest, SETTINGS_KEY, ADMIN, "sk-up-acme-999", "sk-up-seeded"):
            assert secret_text not in log


def test_logs_hold_no_key_and_no_prompt_unless_prompt_logging_is_on(migrated_db_url, home, start_proxy):
    prompt = canary("Prompt")
    for log_prompts in ("false", "true"):
        proxy = start_proxy(home / f"log-{log_prompts}", _env(migrated_db_url, MEMCI_LOG_LEVEL="debug",
                                                              MEMCI_LOG_PROMPTS=log_prompts))
        client = sdk(proxy, SETTINGS_KEY)
        ask(client, f"my secret is {prompt} [[len:10]]")
        with pytest.raises(openai.AuthenticationError):
            ask(sdk(proxy, "sk-wrong-key-abcdef123456"), f"nope {prompt}")
        r = httpx.post(proxy.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {SETTINGS_KEY}"},
                       content=b'{"messages": [', timeout=10)
        assert r.status_code == 400
        time.sleep(0.3)
        log = proxy.log()
        for key in (SETTINGS_KEY, ADMIN, "sk-up-seeded", "sk-wrong-key-abcdef123456"):
            assert key not in log
        if log_prompts == "true":
            assert prompt in log and "DEBUG memci.auth" in log  # switched on explicitly: request bodies logged
        else:
            assert prompt not in log
