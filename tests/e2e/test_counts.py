"""Counts learned from the upstream and cache keys passed on, end to end: openai SDK -> proxy -> emulator.

- the upstream receives `prompt_cache_key` = the conversation id (a client's own key as sent);
- with `session_affinity_header` set, the upstream receives that header with the conversation id;
- a conversation with an image every turn stays in budget while the proxy learns the image's real cost (the
  emulator counts 66 tokens an image, the flat estimate 256) and counts text with the emulator's /tokenize.
"""

from __future__ import annotations

import base64
import hashlib
import re

import httpx
import pytest
import xxhash

from memci_proxy.turn.counting import SAMPLE_EVERY

WINDOW = 4096
MAX_TOKENS = 128
AFFINITY = "X-Session-Affinity"


def budget(window: int = WINDOW, max_tokens: int = MAX_TOKENS, margin: float = 0.10) -> int:
    return window - max_tokens - int(margin * window)


def chat_requests(emulator, n: int = 20) -> list[dict]:
    """The proxied chat requests (they carry the recall tool), newest last."""
    return [item for item in emulator.requests(n)
            if any((t.get("function") or {}).get("name") == "recall" for t in item["body"].get("tools") or [])]


def metric(text: str, name: str) -> float:
    found = re.findall(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(found[0]) if found else 0.0


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    # the turns' short questions are counted by /tokenize too (by default only texts of 256 characters and more)
    return emulator_and_proxy(WINDOW, {"MEMCI_SESSION_AFFINITY_HEADER": AFFINITY, "MEMCI_TOKENIZE_MIN_CHARS": "16"})


def test_prompt_cache_key_and_affinity_header_carry_the_conversation_id(pair, client_for):
    client = client_for(pair.proxy)
    messages = [{"role": "user", "content": "Hello there, how are you? [[len:20]]"}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=MAX_TOKENS)
    conversation = raw.headers["x-memci-conversation-id"]
    sent = chat_requests(pair.emulator)[-1]
    assert sent["body"]["prompt_cache_key"] == conversation
    assert sent["headers"][AFFINITY.lower()] == conversation

    other = [{"role": "user", "content": "A different chat with its own key. [[len:20]]"}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=other, max_tokens=MAX_TOKENS,
                                                           extra_body={"prompt_cache_key": "client-key-7"})
    sent = chat_requests(pair.emulator)[-1]
    assert sent["body"]["prompt_cache_key"] == "client-key-7"  # the client's own key, as sent
    assert sent["headers"][AFFINITY.lower()] == raw.headers["x-memci-conversation-id"]


def test_no_affinity_header_by_default(emulator_and_proxy, client_for):
    plain = emulator_and_proxy(WINDOW)
    client = client_for(plain.proxy)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi! [[len:10]]"}], max_tokens=MAX_TOKENS)
    sent = chat_requests(plain.emulator)[-1]
    assert AFFINITY.lower() not in sent["headers"]
    assert sent["body"]["prompt_cache_key"] == raw.headers["x-memci-conversation-id"]


def image(i: int) -> str:
    data = b"\x89PNG\r\n\x1a\n" + hashlib.sha256(str(i).encode()).digest() * 40
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_images_conversation_stays_in_budget_with_learned_counts(pair, client_for):
    client = client_for(pair.proxy)
    messages: list[dict] = [{"role": "system", "content": "You look at screenshots."}]
    prompts: list[int] = []
    for turn in range(60):
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"Turn {turn}: what does this screenshot show, in some detail? [[len:60]]"},
            {"type": "image_url", "image_url": {"url": image(turn % 7)}},
        ]})
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        assert r.usage.prompt_tokens <= budget(), f"turn {turn}: {r.usage.prompt_tokens} > {budget()}"
        prompts.append(r.usage.prompt_tokens)
    text = httpx.get(pair.proxy.url + "/metrics", timeout=10).text
    assert metric(text, 'memci_tokenize_requests_total{outcome="ok"}') > 0  # the emulator's /tokenize was used
    assert metric(text, "memci_token_estimate_error_ratio_count") >= 60
    # with the images' real cost learned, the prompt fills the budget instead of leaving most of it unused
    assert max(prompts[30:]) > 0.6 * budget()


def test_streamed_answers_sent_back_are_not_tokenized_again(pair, client_for):
    """A streamed answer is counted by its completion tokens (the usage chunk the proxy asks for): the next turns
    ask /tokenize for their new questions only, not for the answers the client sends back."""
    client = client_for(pair.proxy)
    messages = [{"role": "user", "content": "Streamed turn 0: tell me about the old harbour. [[len:40]]"}]
    before = pair.emulator.stats()["tokenized_texts"]
    turns = 8
    for turn in range(turns):
        stream = client.chat.completions.create(model="m", messages=messages, max_tokens=MAX_TOKENS, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert len(text) > 16
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": f"Streamed turn {turn + 1}: and what happened next? [[len:40]]"}]
    asked = pair.emulator.stats()["tokenized_texts"] - before
    # the questions (counted behind the turn): each of them while the process calibrates its counts, then those its
    # sample takes; 2 x turns - 1 texts if the answers sent back were asked too
    questions = [m["content"] for m in messages if m["role"] == "user"][:turns]
    sampled = sum(xxhash.xxh3_64_intdigest(q.encode()) % SAMPLE_EVERY == 0 for q in questions)
    assert sampled <= asked <= turns, (sampled, asked)
