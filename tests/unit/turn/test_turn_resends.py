"""A managed turn the upstream refuses is sent once more, in process (memci_proxy.turn.service): planned for the window the
upstream has now, or with the proxy's recall rounds in a shape it takes (remembered)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

import memci_proxy.recall.tool.loop as loop_module
from memci_proxy.recall.tool.rounds import assistant_call_message
from turn_fakes import Chat, ChatUpstream, make_service


@dataclass
class Refusing(ChatUpstream):
    """ChatUpstream that refuses prompts over `window` (when `enforce`) and, when `refuse_null`, an assistant message
    whose content is null (500, as llama-cpp-python's server)."""

    enforce: bool = False
    refuse_null: bool = False
    refused: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            body = json.loads(request.content)
            prompt = sum(len(json.dumps(m)) for m in body["messages"]) // 4
            if self.enforce and prompt + (body.get("max_tokens") or 0) > self.window:
                self.refused.append(body)
                return httpx.Response(400, json={"error": {
                    "message": f"This model's maximum context length is {self.window} tokens. However, you requested "
                               f"{prompt} tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}})
            if self.refuse_null and any(m.get("role") == "assistant" and m.get("content") is None
                                        for m in body["messages"]):
                self.refused.append(body)
                return httpx.Response(500, json={"error": {"message": "1 validation error: messages.1.content: Input "
                                                           "should be a valid string", "type": "internal_server_error"}})
        return super().__call__(request)


def prompt_of(body: dict[str, Any]) -> int:
    return sum(len(json.dumps(m)) for m in body["messages"]) // 4


def resends(service, why: str) -> float:
    return service.metrics.turn_resends.labels(why)._value.get()


async def with_a_recall_round() -> tuple[Refusing, Any, Chat]:
    """A short chat whose last turn had a model-called recall round (kept in the history from then on)."""
    upstream = Refusing()
    service = make_service(upstream)
    chat = Chat(service, words=10)
    for turn in range(3):
        await chat.send(chat.user_text(turn))
    await chat.send('Read page 1. [[recall:{"query": "code0001"}]]')
    return upstream, service, chat


async def test_a_window_that_shrank_is_read_again_and_the_turn_planned_for_it():
    upstream = Refusing(window=16384)
    service = make_service(upstream, context_window=0)  # learned from /v1/models
    chat = Chat(service, words=60)
    for turn in range(20):
        await chat.send(chat.user_text(turn))
    assert prompt_of(upstream.requests[-1]) > 2400 and chat.last_headers["X-Memci-Pages-Archived"] == "0"

    upstream.window, upstream.enforce = 2048, True  # restarted with a smaller window
    out = await chat.send(chat.user_text(20))
    assert out["choices"][0]["message"]["content"] and len(upstream.refused) == 1
    assert prompt_of(upstream.requests[-1]) + 64 <= 2048 and int(chat.last_headers["X-Memci-Pages-Archived"]) > 0
    assert resends(service, "window") == 1
    for turn in range(21, 25):  # planned for 2048 from now on: no refusal
        out = await chat.send(chat.user_text(turn))
        assert out["choices"][0]["message"]["content"]
    assert len(upstream.refused) == 1
    await service.close()


async def test_rounds_stored_with_null_content_are_sent_as_strings_once_refused(monkeypatch):
    """A conversation whose recall round was kept before the proxy wrote "" keeps its null bytes; an upstream that
    refuses them gets them as strings, and the choice holds for later turns (the same bytes each time)."""
    monkeypatch.setattr(loop_module, "assistant_call_message",
                        lambda content, calls, extra=None: {**assistant_call_message(content, calls, extra),
                                                            "content": content or None})
    upstream, service, chat = await with_a_recall_round()
    assert any(m.get("content") is None and m.get("tool_calls") for m in upstream.requests[-1]["messages"])
    monkeypatch.undo()

    upstream.refuse_null = True
    out = await chat.send(chat.user_text(4))
    assert out["choices"][0]["message"]["content"] and len(upstream.refused) == 1
    sent = upstream.requests[-1]["messages"]
    (kept,) = [m for m in sent if m.get("tool_calls")]
    assert kept["content"] == "" and any(m["role"] == "tool" for m in sent)
    assert resends(service, "rounds") == 1
    out = await chat.send(chat.user_text(5))
    assert out["choices"][0]["message"]["content"] and len(upstream.refused) == 1  # remembered
    assert upstream.requests[-1]["messages"][: len(sent)] == sent  # the same bytes: the prefix stays cached
    await service.close()


async def test_an_unrelated_error_goes_back_to_the_client_after_the_shapes_ran_out():
    upstream, service, chat = await with_a_recall_round()
    before = len(upstream.requests)

    def refuse_all(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/chat/completions"):
            upstream.refused.append(json.loads(request.content))
            return httpx.Response(400, json={"error": {"message": "temperature must be at most 2"}})
        return ChatUpstream.__call__(upstream, request)

    service.exchange.client.client._transport = httpx.MockTransport(refuse_all)
    out = await chat.send(chat.user_text(4))
    assert out["error"]["message"] == "temperature must be at most 2"
    assert len(upstream.refused) == 3  # as sent, as text, left out: then the upstream's own answer
    assert len(upstream.requests) == before and resends(service, "rounds") == 0
    await service.close()
