"""Upstream failures are seen: each one (no connection, time-out, error status, a stream ended early) is one WARNING
line with its status and conversation id and no message content, one count of memci_upstream_errors_total{kind},
and a stream that started and then failed is marked so, for the edge to count it as status "stream_cut"."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx
import pytest

from memci_proxy.metrics import Metrics
from memci_proxy.upstream import outcome
from memci_proxy.upstream.exchange import Exchange, Outgoing
from memci_proxy.upstream.failures import KINDS
from memci_proxy.wire.errors import upstream_timeout, upstream_unreachable
from turn_fakes import Chat, MockUpstream, answer_of, call_of, make_service

SECRET = "the user's secret words"
CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"role": "assistant", "content": "partial answer"}, "finish_reason": None}]}
FIRST_EVENT = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"  # what the upstream sends before it stops


def _count(metrics: Metrics, metric, *labels: str) -> float:
    return (metric.labels(*labels) if labels else metric)._value.get()


def _outgoing(stream: bool, conversation: str | None = None) -> Outgoing:
    body = json.dumps({"model": "m", "stream": stream, "messages": [{"role": "user", "content": SECRET}]}).encode()
    extra = {"X-Memci-Conversation-Id": conversation} if conversation else None
    return Outgoing("chat", "POST", "/chat/completions", "", {}, body, time.perf_counter(), stream, extra_headers=extra)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "memci.upstream"]


def _cut_stream(_request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, headers={"Content-Type": "text/event-stream"},
                          content=FIRST_EVENT)


def _chat_upstream(stream: Callable[[httpx.Request], httpx.Response]) -> Callable[[httpx.Request], httpx.Response]:
    """An upstream that knows its context length, has no tokenizer endpoint and answers a chat with ``stream``."""
    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})
        if request.url.path.endswith("/tokenize"):
            return httpx.Response(404)
        return stream(request)

    return upstream


async def _managed_turn(upstream: Callable[[httpx.Request], httpx.Response], caplog) -> tuple[Any, str, bytes]:
    """One streamed managed turn: the service, the conversation id and every event the client got."""
    service = make_service(upstream)
    caplog.set_level(logging.WARNING)
    chat = Chat(service)
    chat.messages.append({"role": "user", "content": SECRET})
    answer = await service.handle(call_of(chat.messages, stream=True))
    return service, answer.headers["X-Memci-Conversation-Id"], b"".join(await answer_of(answer))


async def test_a_cut_stream_is_logged_counted_and_not_a_200(caplog) -> None:
    metrics = Metrics()
    exchange = Exchange(MockUpstream(_cut_stream), metrics)
    caplog.set_level(logging.WARNING)
    ended = outcome.begin()
    answer = await exchange.send(_outgoing(stream=True, conversation="conv-1"))
    events = await answer_of(answer)
    assert b"upstream_cut" in b"".join(events)
    assert _count(metrics, metrics.upstream_errors, "stream_cut") == 1
    assert ended.stream_failed  # the edge counts the request as stream_cut (tests/e2e/test_request_metrics.py)
    [line] = _warnings(caplog)
    assert "stream_cut" in line and "status 200" in line and "conversation conv-1" in line
    assert SECRET not in caplog.text and "partial answer" not in caplog.text


@pytest.mark.parametrize("status,kind", [(500, "http_5xx"), (429, "http_4xx"), (404, "http_4xx")])
async def test_an_error_status_is_logged_and_counted(caplog, status, kind) -> None:
    metrics = Metrics()
    exchange = Exchange(MockUpstream(lambda r: httpx.Response(status, json={"error": {"message": SECRET}})), metrics)
    caplog.set_level(logging.WARNING)
    answer = await exchange.send(_outgoing(stream=False))
    assert answer.status == status and SECRET.encode() in answer.body  # passed on unchanged
    assert _count(metrics, metrics.upstream_errors, kind) == 1
    [line] = _warnings(caplog)
    assert f"status {status}" in line and "conversation -" in line and SECRET not in line


class _Unreachable(MockUpstream):
    def __init__(self, error) -> None:
        super().__init__(lambda r: httpx.Response(200))
        self.error = error

    async def send(self, method, url, headers, body):
        raise self.error


@pytest.mark.parametrize("error,kind,status", [(upstream_unreachable("connection refused"), "unreachable", 502),
                                               (upstream_timeout("read"), "timeout", 504)])
async def test_no_connection_or_a_time_out_is_logged_and_counted(caplog, error, kind, status) -> None:
    metrics = Metrics()
    exchange = Exchange(_Unreachable(error), metrics)
    caplog.set_level(logging.WARNING)
    with pytest.raises(type(error)):
        await exchange.send(_outgoing(stream=True, conversation="conv-2"))
    assert _count(metrics, metrics.upstream_errors, kind) == 1
    [line] = _warnings(caplog)
    assert kind in line and f"status {status}" in line and "conversation conv-2" in line


async def test_a_managed_turn_whose_stream_is_cut_names_its_conversation(caplog) -> None:
    ended = outcome.begin()
    service, cid, events = await _managed_turn(_chat_upstream(_cut_stream), caplog)
    assert b"upstream_cut" in events
    m = service.metrics
    assert _count(m, m.upstream_errors, "stream_cut") == 1
    assert ended.stream_failed
    lines = _warnings(caplog)
    assert len(lines) == 1 and f"conversation {cid}" in lines[0] and "no finish_reason" in lines[0]
    assert SECRET not in caplog.text
    await service.close()


# How a connection dropped mid-stream reaches the proxy depends on when the upstream's server closes it: a body cut
# short (ClientPayloadError), a reset (ClientConnectionResetError, or ClientOSError from the socket) or a disconnect
# (ServerDisconnectedError). Each is the same failure: an error event and [DONE] for the client, one stream_cut count and line.
_DROPS = [aiohttp.ClientPayloadError("Response payload is not completed"), aiohttp.ServerDisconnectedError(),
          aiohttp.ClientConnectionResetError("Connection reset by peer"), aiohttp.ClientOSError(104, "reset")]


def _dropped_stream(error: Exception):
    async def body():
        yield FIRST_EVENT
        raise error

    return _chat_upstream(lambda _request: httpx.Response(200, headers={"Content-Type": "text/event-stream"},
                                                          content=body()))


@pytest.mark.parametrize("error", _DROPS, ids=lambda e: type(e).__name__)
async def test_a_connection_dropped_mid_stream_is_a_cut_however_it_surfaces(caplog, error) -> None:
    metrics = Metrics()
    exchange = Exchange(MockUpstream(_dropped_stream(error)), metrics)
    caplog.set_level(logging.WARNING)
    ended = outcome.begin()
    events = b"".join(await answer_of(await exchange.send(_outgoing(stream=True))))
    assert b"upstream_cut" in events and events.endswith(b"data: [DONE]\n\n")
    assert _count(metrics, metrics.upstream_errors, "stream_cut") == 1
    assert ended.stream_failed
    assert _count(metrics, metrics.client_disconnects) == 0  # the upstream left, not the client
    [line] = _warnings(caplog)
    assert f"stream_cut, status 200, route chat, conversation - ({type(error).__name__})" in line


@pytest.mark.parametrize("error", _DROPS, ids=lambda e: type(e).__name__)
async def test_a_managed_turn_whose_connection_drops_mid_stream_is_a_cut(caplog, error) -> None:
    ended = outcome.begin()
    service, cid, events = await _managed_turn(_dropped_stream(error), caplog)
    assert b"upstream_cut" in events and events.endswith(b"data: [DONE]\n\n")
    m = service.metrics
    assert _count(m, m.upstream_errors, "stream_cut") == 1
    assert ended.stream_failed
    assert _count(m, m.client_disconnects) == 0
    [line] = _warnings(caplog)
    assert f"conversation {cid} ({type(error).__name__})" in line and SECRET not in caplog.text
    await service.close()


def test_every_kind_is_documented() -> None:
    from memci_proxy.metrics_doc import markdown

    doc = markdown()
    assert all(f"`{kind}`" in doc for kind in KINDS) and "`stream_cut`" in doc


async def test_a_later_recall_round_that_cannot_connect_ends_the_stream_with_an_error_event(caplog) -> None:
    from memci_proxy.wire.errors import upstream_unreachable as unreachable
    from turn_fakes import ChatUpstream

    chat_upstream = ChatUpstream()
    service = make_service(chat_upstream)
    client = service.exchange.client
    send = client.send
    calls = {"chat": 0}

    async def failing_second_round(method, url, headers, body):
        if url.endswith("/chat/completions"):
            calls["chat"] += 1
            if calls["chat"] == 2:
                raise unreachable("connection refused")
        return await send(method, url, headers, body)

    client.send = failing_second_round
    caplog.set_level(logging.WARNING)
    chat = Chat(service)
    chat.messages.append({"role": "user", "content": 'look it up [[recall:{"query": "gym"}]]'})
    ended = outcome.begin()
    answer = await service.handle(call_of(chat.messages, stream=True))
    events = b"".join(await answer_of(answer))
    assert b"upstream_unreachable" in events and events.rstrip().endswith(b"data: [DONE]")
    m = service.metrics
    assert _count(m, m.upstream_errors, "unreachable") == 1
    assert ended.stream_failed
    assert m.client_disconnects._value.get() == 0
    assert len(_warnings(caplog)) == 1
    await service.close()
