"""Context management end to end: openai SDK -> proxy (embedded PostgreSQL, in-process hot state) -> emulator."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.e2e.conftest import EmulatorProcess
from tests.e2e.proxyproc import ProxyProcess

WINDOW = 8192
MAX_TOKENS = 256
ADMIN = "admin-secret"


def budget(window: int = WINDOW, max_tokens: int = MAX_TOKENS, margin: float = 0.10) -> int:
    return window - max_tokens - int(margin * window)


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(WINDOW, {"MEMCI_ADMIN_KEY": ADMIN})


@pytest.fixture(scope="module")
def emulator_8k(pair):
    return pair.emulator


@pytest.fixture(scope="module")
def managed(pair):
    return pair.proxy


def talk(client: openai.OpenAI, messages: list[dict], text: str, **kw):
    messages.append({"role": "user", "content": text})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=MAX_TOKENS, **kw)
    r = raw.parse()
    messages.append({"role": "assistant", "content": r.choices[0].message.content})
    return raw.headers, r


def test_300_turns_stay_under_budget_with_a_contents_page(managed, emulator_8k, client_for):
    client = client_for(managed)
    messages: list[dict] = [{"role": "system", "content": "You are a patient tutor."}]
    prompt_sum = cached_sum = 0
    epochs = 0
    conversation = None
    for turn in range(300):
        headers, r = talk(client, messages, f"Question {turn}: explain idea number {turn} in detail. [[len:110]]")
        assert r.usage.prompt_tokens <= budget(), f"turn {turn}: {r.usage.prompt_tokens} > {budget()}"
        prompt_sum += r.usage.prompt_tokens
        cached_sum += r.usage.prompt_tokens_details.cached_tokens
        epochs += headers["x-memci-epoch"] == "true"
        conversation = conversation or headers["x-memci-conversation-id"]
        assert headers["x-memci-conversation-id"] == conversation
    assert int(headers["x-memci-pages-archived"]) > 100
    assert epochs >= 3
    sent = emulator_8k.turn_requests(1)[0]["body"]["messages"]
    assert sent[0]["role"] == "system"
    assert sent[0]["content"] == "You are a patient tutor."  # the client's system prompt alone: cached across epochs
    assert sent[1]["content"].startswith("<memci-context>\n## Contents of archived pages")
    assert sent[-1]["content"] == messages[-2]["content"]  # the client's own words, unchanged
    hit_rate = cached_sum / prompt_sum
    assert hit_rate >= 0.95, hit_rate

    admin = httpx.get(f"{managed.url}/memci/conversations/{conversation}/prompt",
                      headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert admin.status_code == 200
    view = admin.json()
    assert view["messages"] == sent
    assert [b["name"] for b in view["blocks"]][0].startswith("B1")
    states = {p["state"] for p in view["pages"]}
    assert {"active", "archived"} <= states


def test_admin_endpoint_needs_the_admin_key(managed):
    r = httpx.get(f"{managed.url}/memci/conversations/x/prompt", timeout=10)
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_admin_key"


def test_responses_say_what_happened(managed, client_for):
    client = client_for(managed)
    headers, _ = talk(client, [], "hello [[len:5]]")
    assert headers["x-memci-pages-active"] == "1"
    assert headers["x-memci-pages-archived"] == "0"
    assert headers["x-memci-epoch"] == "false"


def test_streaming_managed_conversation(managed, client_for):
    client = client_for(managed)
    messages: list[dict] = []
    for turn in range(3):
        messages.append({"role": "user", "content": f"streamed turn {turn} [[len:20]]"})
        chunks = list(client.chat.completions.create(model="m", messages=messages, stream=True,
                                                     stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        messages.append({"role": "assistant", "content": text})
        usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_explicit_session_key_continues_across_edits(managed, client_for):
    client = client_for(managed)
    h1, _ = talk(client, [], "first [[len:5]]", extra_headers={"X-Session-Id": "sess-1"})
    h2, _ = talk(client, [], "unrelated start [[len:5]]", extra_headers={"X-Session-Id": "sess-1"})
    assert h1["x-memci-conversation-id"] == h2["x-memci-conversation-id"]


def test_regenerate_forks_without_disturbing_the_original(managed, client_for):
    client = client_for(managed)
    base: list[dict] = []
    h1, _ = talk(client, base, "fork base one [[len:5]]")
    h2, _ = talk(client, base, "fork base two [[len:5]]")
    original = h2["x-memci-conversation-id"]
    assert h1["x-memci-conversation-id"] == original
    edited = base[:2]  # edit the second question
    h3, _ = talk(client, edited, "fork base two, edited [[len:5]]")
    assert h3["x-memci-conversation-id"] != original
    h4, _ = talk(client, base, "fork base three [[len:5]]")
    assert h4["x-memci-conversation-id"] == original


def test_tenants_do_not_share_conversations(managed, client_for):
    a = client_for(managed, api_key="sk-tenant-a")
    b = client_for(managed, api_key="sk-tenant-b")
    ha, _ = talk(a, [], "identical opening line [[len:5]]")
    hb, _ = talk(b, [], "identical opening line [[len:5]]")
    assert ha["x-memci-conversation-id"] != hb["x-memci-conversation-id"]


def test_restart_mid_conversation_carries_on_with_the_same_pages(tmp_path, client_for):
    emu = EmulatorProcess(["--max-model-len", "4096"]).start()
    home = tmp_path / "home"
    try:
        proxy = ProxyProcess(emu.base_url, home).start()
        client = client_for(proxy)
        messages: list[dict] = []
        for turn in range(40):
            headers, _ = talk(client, messages, f"before restart {turn} [[len:100]]")
        conversation = headers["x-memci-conversation-id"]
        archived = int(headers["x-memci-pages-archived"])
        assert archived > 0
        last_prompt = emu.turn_requests(1)[0]["body"]["messages"]
        proxy.stop()

        proxy = ProxyProcess(emu.base_url, home, port=proxy.port).start()
        client = client_for(proxy)
        headers, r = talk(client, messages, "after restart [[len:20]]")
        assert headers["x-memci-conversation-id"] == conversation
        assert int(headers["x-memci-pages-archived"]) >= archived
        sent = emu.turn_requests(1)[0]["body"]["messages"]
        if headers["x-memci-epoch"] == "false":
            assert sent[: len(last_prompt) - 1] == last_prompt[:-1]
            assert r.usage.prompt_tokens_details.cached_tokens > 0.8 * r.usage.prompt_tokens
        proxy.stop()
    finally:
        emu.stop()
