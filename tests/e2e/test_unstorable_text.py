"""Text PostgreSQL cannot hold (U+0000) and text msgspec cannot hold (a lone surrogate, JSON's "\\ud800"), on all
three APIs, end to end: the upstream gets exactly what the client sent, the conversation archives its pages as usual
(no fall-back to a sliding window), and recall gives the text back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import json

import httpx
import pytest

FACT = "My locker code is 7349 and the tool printed \x00\x01\x02 \ud800 x\udfff \ufdd0ud801 (binary)."
TURNS = 36
RECALL = 'What was my locker code? [[call:recall {"pages": [3]}]]'


@pytest.fixture(scope="module")
def pair(emulator_and_proxy):
    return emulator_and_proxy(4096)


@pytest.fixture(scope="module")
def http(proxy):
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        yield client


def post(http: httpx.Client, path: str, headers: dict[str, str], body: dict[str, Any]) -> httpx.Response:
    """``body`` as JSON with every non-ASCII character escaped (lone surrogates as "\\ud800", which httpx's own
    encoding refuses)."""
    return http.post(path, content=json.dumps(body).encode(), headers={**headers, "Content-Type": "application/json"})


def _text(turn: int) -> str:
    return (FACT if turn == 3 else f"Chit-chat number {turn} about the weather and the news.") + " [[len:80]]"


def _chat(http: httpx.Client, key: str) -> Callable[[str], httpx.Response]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]

    def say(text: str) -> httpx.Response:
        r = post(http, "/v1/chat/completions", {"Authorization": f"Bearer {key}"},
                 {"model": "m", "max_tokens": 200, "messages": [*messages, {"role": "user", "content": text}]})
        assert r.status_code == 200, r.text[:500]
        messages.extend([{"role": "user", "content": text}, r.json()["choices"][0]["message"]])
        return r
    return say


def _messages(http: httpx.Client, key: str) -> Callable[[str], httpx.Response]:
    messages: list[dict[str, Any]] = []

    def say(text: str) -> httpx.Response:
        turn = {"role": "user", "content": [{"type": "text", "text": text}]}
        r = post(http, "/v1/messages", {"x-api-key": key, "anthropic-version": "2023-06-01"},
                 {"model": "m", "max_tokens": 200, "system": "You are a helpful assistant. \udc00",
                  "messages": [*messages, turn]})
        assert r.status_code == 200, r.text[:500]
        messages.extend([turn, {"role": "assistant", "content": r.json()["content"]}])
        return r
    return say


def _responses(http: httpx.Client, key: str) -> Callable[[str], httpx.Response]:
    previous: list[str | None] = [None]

    def say(text: str) -> httpx.Response:
        r = post(http, "/v1/responses", {"Authorization": f"Bearer {key}"},
                 {"model": "m", "max_output_tokens": 200, "input": text,
                  "instructions": "You are a helpful assistant. \x00 \ud800",
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
            sent = emu.turn_requests(1)[0]["body"]["messages"]
            assert FACT in sent[-1]["content"]  # the upstream got the client's exact text
        if turn > 3 and int(r.headers.get("x-memci-pages-archived", 0)) >= archived:
            break  # managed all along: no sliding window
    else:
        raise AssertionError(f"fewer than {archived} pages archived after {turns} turns")
    say(RECALL)
    last = emu.turn_requests(1)[0]["body"]["messages"]
    assert last[-1]["role"] == "tool" and "[Page 3]" in last[-1]["content"]
    assert FACT in last[-1]["content"]  # the NUL back from the store


APIS = [_chat, _messages, _responses]


@pytest.mark.parametrize("api", APIS, ids=["chat", "messages", "responses"])
def test_a_conversation_holding_nul_archives_and_recalls_it(api, http, proxy, emu):
    archive_and_recall(api(http, f"sk-nul-{api.__name__}"), emu, 10)
    assert "could not store" not in proxy.log() and "Traceback" not in proxy.log()


LONE = "a\ud800 b\udfff c\ufdd0 d\\ud800 e😀"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages",
                                  "/v1/messages/count_tokens"])
def test_a_lone_surrogate_is_accepted_and_sent_upstream_as_written(path, http, proxy, emu):
    body = {"model": "m", "max_tokens": 20, "input": LONE, "messages": [{"role": "user", "content": LONE}]}
    if path == "/v1/responses":
        del body["messages"]
    r = post(http, path, {"Authorization": "Bearer sk-lone", "x-api-key": "sk-lone"}, body)
    assert r.status_code == 200, r.text[:300]
    if path.endswith("count_tokens"):
        assert r.json()["input_tokens"] > 0
    else:
        sent = emu.turn_requests(1)[0]["body"]["messages"]
        assert sent[-1]["content"] == LONE or sent[-1]["content"] == [{"type": "text", "text": LONE}]
    assert "Traceback" not in proxy.log()


def test_the_responses_object_echoes_instructions_as_written(http):
    r = post(http, "/v1/responses", {"Authorization": "Bearer sk-lone"},
             {"model": "m", "max_output_tokens": 20, "input": "hi", "instructions": LONE})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["instructions"] == LONE


def test_the_history_and_the_export_give_the_text_back_as_written(http):
    key = {"Authorization": "Bearer sk-lone-export"}
    r = post(http, "/v1/chat/completions", key,
             {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": LONE}]})
    assert r.status_code == 200, r.text[:300]
    conversation = r.headers["x-memci-conversation-id"]
    for path in (f"/memci/conversations/{conversation}", f"/memci/conversations/{conversation}/export"):
        got = http.get(path, headers=key)
        assert got.status_code == 200, got.text[:300]
        assert LONE in _strings(got.json()), path


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [s for v in value for s in _strings(v)] if isinstance(value, list) else []
