"""Text PostgreSQL cannot hold (U+0000), on all three APIs, end to end: the upstream gets exactly what the client
sent, the conversation archives its pages as usual (no fall-back to a sliding window), and recall gives the
NUL back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

FACT = "My locker code is 7349 and the tool printed \x00\x01\x02 (binary)."
TURNS = 36
RECALL = 'What was my locker code? [[call:recall {"pages": [3]}]]'


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096)


@pytest.fixture(scope="module")
def http(proxy):
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        yield client


def _text(turn: int) -> str:
    return (FACT if turn == 3 else f"Chit-chat number {turn} about the weather and the news.") + " [[len:80]]"


def _chat(http: httpx.Client, key: str) -> Callable[[str], httpx.Response]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]

    def say(text: str) -> httpx.Response:
        r = http.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "m", "max_tokens": 200, "messages": [*messages, {"role": "user", "content": text}]})
        assert r.status_code == 200, r.text[:500]
        messages.extend([{"role": "user", "content": text}, r.json()["choices"][0]["message"]])
        return r
    return say


def _messages(http: httpx.Client, key: str) -> Callable[[str], httpx.Response]:
    messages: list[dict[str, Any]] = []

    def say(text: str) -> httpx.Response:
        turn = {"role": "user", "content": [{"type": "text", "text": text}]}
        r = http.post("/v1/messages", headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
                      json={"model": "m", "max_tokens": 200, "system": "You are a helpful assistant.",
                            "messages": [*messages, turn]})
        assert r.status_code == 200, r.text[:500]
        messages.extend([turn, {"role": "assistant", "content": r.json()["content"]}])
        return r
    return say


def _responses(http: httpx.Client, key: str) -> Callable[[str], httpx.Response]:
    previous: list[str | None] = [None]

    def say(text: str) -> httpx.Response:
        r = http.post("/v1/responses", headers={"Authorization": f"Bearer {key}"},
                      json={"model": "m", "max_output_tokens": 200, "input": text,
                            "instructions": "You are a helpful assistant. \x00",
                            "previous_response_id": previous[0]})
        assert r.status_code == 200, r.text[:500]
        previous[0] = r.json()["id"]
        return r
    return say


def archive_and_recall(say: Callable[[str], httpx.Response], emu: Any, archived: int, turns: int = 200) -> None:
    """Turns until ``archived`` pages are archived (the upstream getting the NUL as sent), then page 3 recalled:
    the NUL comes back from the store."""
    for turn in range(1, turns + 1):
        r = say(_text(turn))
        if turn == 3:
            sent = emu.requests(1)[0]["body"]["messages"]
            assert FACT in sent[-1]["content"]  # the upstream got the client's exact text
        if turn > 3 and int(r.headers.get("x-memci-pages-archived", 0)) >= archived:
            break  # managed all along: no sliding window
    else:
        raise AssertionError(f"fewer than {archived} pages archived after {turns} turns")
    say(RECALL)
    last = emu.requests(1)[0]["body"]["messages"]
    assert last[-1]["role"] == "tool" and "[Page 3]" in last[-1]["content"]
    assert FACT in last[-1]["content"]  # the NUL back from the store


APIS = [_chat, _messages, _responses]


@pytest.mark.parametrize("api", APIS, ids=["chat", "messages", "responses"])
def test_a_conversation_holding_nul_archives_and_recalls_it(api, http, proxy, emu):
    archive_and_recall(api(http, f"sk-nul-{api.__name__}"), emu, 10)
    assert "could not store" not in proxy.log() and "Traceback" not in proxy.log()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages",
                                  "/v1/messages/count_tokens"])
def test_a_lone_surrogate_escape_is_a_400_not_a_5xx(path, http, proxy):
    body = (b'{"model": "m", "max_tokens": 20, "input": "a\\ud800", "messages": [{"role": "user", '
            b'"content": "a\\ud800"}]}')
    r = http.post(path, content=body, headers={"Authorization": "Bearer sk-x", "x-api-key": "sk-x",
                                                "Content-Type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert "error" in r.json() and "Traceback" not in proxy.log()
