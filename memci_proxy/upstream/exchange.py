"""The one upstream exchange: a request sent, the answer relayed, recall rounds run when the turn asks for them.

Pass-through, managed and recall requests all come through here, so metrics, the answer's headers, upstream errors
and client disconnects are handled once:
- ``send``: plain forwarding, the exchange with zero recall rounds. The answer goes back byte for byte, event by
  event when streamed.
- ``send_with_recall``: the recall loop (``memci_proxy.recall.tool.loop``) answers the model's ``recall`` calls and asks
  again; the client sees one ordinary completion.

An upstream that cannot be reached or times out raises ProxyError (502/504) before anything reached the client;
an error status is passed on with its body. A client that leaves closes the events' iterator, which closes (and so
cancels) the upstream request. Each upstream failure (no connection, a time-out, a 4xx/5xx status, a stream ended
early) is counted and logged once, by memci_proxy.upstream.failures; a stream that started and then failed is marked in
memci_proxy.upstream.outcome, so that the edge counts the request with status ``stream_cut``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

from memci_proxy.metrics import Metrics
from memci_proxy.recall.tool.loop import LoopConfig, complete_json, replay_as_stream, stream_rounds
from memci_proxy.recall.tool.rounds import LoopRecord, ToolCall
from memci_proxy.upstream.client import response_headers
from memci_proxy.upstream import outcome
from memci_proxy.upstream.failures import Failures, kind_of_code
from memci_proxy.upstream.port import Upstream, UpstreamResponse
from memci_proxy.upstream.relay import relay_sse, usage_of_json
from memci_proxy.wire.errors import ProxyError
from memci_proxy.wire.sse import DONE, encode_data
from memci_proxy.upstream.unpaired_answer import InternalTextResponse
from memci_proxy.wire.unpaired import to_wire

_T = TypeVar("_T")
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE = "text/event-stream"


@dataclass(slots=True)
class Outgoing:
    """One request for the upstream, as the route or the turn prepared it."""

    route: str  # metrics label: "chat" or "other"
    method: str
    path: str  # relative to the OpenAI base URL, e.g. "/chat/completions"
    query: str
    headers: Mapping[str, str]  # the client's headers; hop-by-hop and proxy-owned ones are dropped on the way
    body: bytes | None
    started: float  # time.perf_counter() when the client's request arrived
    stream: bool = False  # the client asked for server-sent events
    route_key: str | None = None  # keeps a conversation on one upstream worker
    extra_headers: Mapping[str, str] | None = None  # added to the answer (X-Memci-*)
    upstream_headers: Mapping[str, str] | None = None  # added to the request upstream (session affinity)
    # The body's text was rewritten on arrival (memci_proxy.wire.unpaired.to_internal): restored on every send upstream.
    internal_text: bool = False


@dataclass(slots=True)
class Answer:
    """What goes back to the client: a whole body, or events as they come (``events`` set)."""

    status: int
    headers: dict[str, str]
    media_type: str | None
    body: bytes = b""
    events: AsyncIterator[bytes] | None = None
    # The body or events hold text in the proxy's internal form (memci_proxy.wire.unpaired): restored for the client.
    internal_text: bool = False


class RecallRounds(Protocol):
    """What a managed turn gives the exchange to run recall rounds."""

    config: LoopConfig
    record: LoopRecord

    async def resolve(self, call: ToolCall) -> str:
        """The text of the tool result for one recall call."""

    async def keep(self, exchange: list[dict[str, Any]]) -> None:
        """Keep a finished exchange for later turns; called before the next round goes upstream."""


class Exchange:
    def __init__(self, client: Upstream, metrics: Metrics) -> None:
        self.client = client
        self.metrics = metrics
        self.failures = Failures(metrics)

    def _upstream_headers(self, out: Outgoing) -> dict[str, str]:
        headers = self.client.forward_headers(out.headers)
        if out.upstream_headers:
            mine = {name.lower() for name in out.upstream_headers}
            headers = {k: v for k, v in headers.items() if k.lower() not in mine}
            headers.update(out.upstream_headers)
        return headers

    async def send(self, out: Outgoing, on_usage: Callable[[dict], None] | None = None) -> Answer:
        answer = await self._send_plain(out, on_usage)
        answer.internal_text = out.internal_text
        return answer

    async def send_with_recall(self, out: Outgoing, body: dict[str, Any], rounds: RecallRounds,
                               shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Answer:
        """The recall loop: ``body`` is the first round (recall tool injected, see recall.loop.prepare_rounds);
        ``out.body``, when set, is its encoding. ``shape``, when given, renders every later round's body for this
        upstream (``memci_proxy.turn.shapes``; the first round's is rendered already)."""
        answer = await self._send_rounds(out, body, rounds, shape)
        answer.internal_text = out.internal_text
        return answer

    async def _send_plain(self, out: Outgoing, on_usage: Callable[[dict], None] | None = None) -> Answer:
        """Zero recall rounds: status, headers and body as the upstream sent them; SSE relayed event by event."""
        m = self.metrics
        url = self.client.url(out.path, out.query, out.route_key)
        response, waited = await self._send(out, out.method, url, self._upstream_headers(out), out.body)
        headers, content_type = self._headers(response, out)
        if out.stream and response.status == 200 and content_type.startswith(SSE):
            sent_at = time.perf_counter() - waited
            m.child(m.proxy_overhead, out.route).observe(max(0.0, sent_at - out.started))

            def first_byte() -> None:
                m.upstream_ttft.observe(time.perf_counter() - sent_at)

            def usage_seen(usage: dict) -> None:
                m.observe_usage(usage)
                if on_usage is not None:
                    on_usage(usage)

            ended = _Ended()
            return self._stream(out, headers, relay_sse(response, first_byte, usage_seen, ended.cut), ended=ended)
        m.upstream_ttft.observe(waited)
        read_started = time.perf_counter()
        content = await self._read(out, response)
        upstream_time = waited + (time.perf_counter() - read_started)
        if response.status == 200 and out.route == "chat":
            usage = usage_of_json(content)
            if usage is not None:
                m.observe_usage(usage)
                if on_usage is not None:
                    on_usage(usage)
        total = time.perf_counter() - out.started
        m.child(m.proxy_overhead, out.route).observe(max(0.0, total - upstream_time))
        self._done(out, response.status)
        return Answer(response.status, headers, content_type or None, content)

    async def _send_rounds(self, out: Outgoing, body: dict[str, Any], rounds: RecallRounds,
                           shape: Callable[[dict[str, Any]], dict[str, Any]] | None) -> Answer:
        m = self.metrics
        cfg, record = rounds.config, rounds.record
        client = self.client
        url = client.url(out.path, out.query, out.route_key)
        upstream_headers = self._upstream_headers(out)

        async def send(round_body: dict[str, Any]) -> UpstreamResponse:
            if shape is not None:
                round_body = shape(round_body)
            response, _ = await self._send(out, "POST", url, upstream_headers, _encode(round_body))
            return response

        async def read_body(response: UpstreamResponse) -> bytes:
            return await self._read(out, response)

        m.child(m.proxy_overhead, out.route).observe(max(0.0, time.perf_counter() - out.started))
        first, waited = await self._send(out, "POST", url, upstream_headers, out.body or _encode(body))
        headers, content_type = self._headers(first, out)
        if first.status != 200 or (cfg.stream_upstream and not content_type.startswith(SSE)):
            raw = await read_body(first)
            self._done(out, first.status)
            return Answer(first.status, headers, content_type or None, raw)
        if cfg.stream_upstream:
            sent_at = time.perf_counter() - waited

            def first_byte() -> None:
                m.upstream_ttft.observe(time.perf_counter() - sent_at)

            events = stream_rounds(body, cfg, send, rounds.resolve, record, first, first_byte, keep=rounds.keep)
            return self._stream(out, headers, events, record)
        m.upstream_ttft.observe(waited)
        raw = await read_body(first)
        status, _, content = await complete_json(body, cfg, send, read_body, rounds.resolve, record,
                                                 first=(first, raw), keep=rounds.keep)
        self._account(record)
        self._done(out, status)  # (a later round's error status is passed on, and counted there)
        if out.stream:  # n > 1 streamed: rounds were resolved per choice, now replayed as a stream
            return Answer(200, headers, SSE, events=replay_as_stream(_decode(content), cfg.client_wants_usage))
        return Answer(status, headers, "application/json", content)

    # --------------------------------------------------------------------------------------------------------
    async def _send(self, out: Outgoing, method: str, url: str, headers: Mapping[str, str], body: bytes | None
                    ) -> tuple[UpstreamResponse, float]:
        if not out.internal_text:
            return await self._reported(out, self.client.send(method, url, headers, body))
        response, waited = await self._reported(out, self.client.send(method, url, headers, body and to_wire(body)))
        return InternalTextResponse(response), waited

    async def _read(self, out: Outgoing, response: UpstreamResponse) -> bytes:
        return await self._reported(out, self.client.read_body(response))

    async def _reported(self, out: Outgoing, pending: Awaitable[_T]) -> _T:
        """``pending``'s result; a ProxyError it raises (no connection, a time-out) is counted and logged first."""
        try:
            return await pending
        except ProxyError as exc:
            self.failures.report(kind_of_code(exc.code), exc.status, out.route, _conversation(out), exc.message)
            raise

    def _headers(self, response: UpstreamResponse, out: Outgoing) -> tuple[dict[str, str], str]:
        headers = response_headers(response.headers)
        if out.extra_headers:
            headers.update(out.extra_headers)
        headers.pop("Content-Type", None)
        return headers, response.headers.get("Content-Type", "")

    def _stream(self, out: Outgoing, headers: dict[str, str], events: AsyncIterator[bytes],
                record: LoopRecord | None = None, ended: "_Ended | None" = None) -> Answer:
        return Answer(200, {**headers, **_SSE_HEADERS}, SSE, events=self._relayed(out, events, record, ended))

    async def _relayed(self, out: Outgoing, events: AsyncIterator[bytes], record: LoopRecord | None,
                       ended: "_Ended | None") -> AsyncIterator[bytes]:
        """Every streamed answer passes here: in-flight gauge, disconnects, upstream failures, duration and status,
        counted once. An upstream failure after the first byte (a later recall round unreachable) ends the stream
        with an error event, as a cut does."""
        m = self.metrics
        m.inflight_streams.inc()
        finished = False
        failed = False
        try:
            try:
                async for event in events:
                    yield event
            except ProxyError as exc:  # counted and logged where it was raised (_send, _read)
                failed = True
                await _close(events)
                yield encode_data(exc.body())
                yield DONE
            finished = True
        finally:
            if not finished:
                m.client_disconnects.inc()
                await _close(events)
            m.inflight_streams.dec()
            failure = ended.failure if ended is not None else None
            if record is not None:
                self._account(record)
                failure = failure or record.failure
            if failure is not None:
                kind, status, detail = failure
                self.failures.report(kind, status, out.route, _conversation(out), detail)
            if failed or failure is not None:
                outcome.stream_failed()

    def _account(self, record: LoopRecord) -> None:
        self.metrics.observe_usage(record.usage)
        self.metrics.recall_rounds.observe(record.rounds)

    def _done(self, out: Outgoing, status: int) -> None:
        """An error status the upstream answered is an upstream failure (the request itself is counted at the edge,
        memci_proxy.api.request_metrics)."""
        if status >= 400:
            self.failures.status(status, out.route, _conversation(out))


class _Ended:
    """How a relayed stream ended: ``failure`` set by the relay when the upstream cut it."""

    __slots__ = ("failure",)

    def __init__(self) -> None:
        self.failure: tuple[str, int | None, str] | None = None

    def cut(self, detail: str) -> None:
        self.failure = ("stream_cut", 200, detail)


def _conversation(out: Outgoing) -> str | None:
    """The conversation id of a managed turn (its answer header), None for pass-through."""
    return out.extra_headers.get("X-Memci-Conversation-Id") if out.extra_headers else None


async def _close(events: AsyncIterator[bytes]) -> None:
    close = getattr(events, "aclose", None)
    if close is not None:
        await close()
