"""A managed turn with the recall tool injected: send upstream, resolve recall calls, answer the client."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response
from litestar.response import Stream

from proxy.api.services import Services
from proxy.recall.loop import LoopConfig, complete_json, replay_as_stream, stream_rounds
from proxy.recall.resolver import RecallContext, RecallResolver
from proxy.recall.rounds import ToolCall
from proxy.recall.tool import inject, parse_arguments
from proxy.upstream.client import response_headers

if TYPE_CHECKING:
    from proxy.context.service import Turn

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class RecallPath:
    def __init__(self, services: Services, resolver: RecallResolver) -> None:
        self.services = services
        self.settings = services.settings
        self.metrics = services.metrics
        self.resolver = resolver

    async def run(
        self, request: Request, data: dict[str, Any], turn: Turn, stream: bool, started: float,
        extra_headers: dict[str, str],
    ) -> Response:
        m = self.metrics
        upstream = self.services.upstream
        body, name = inject({**data, "messages": turn.plan.messages}, self.settings.recall_tool_name)
        n = data.get("n") or 1
        stream_upstream = stream and n == 1
        options = data.get("stream_options") if isinstance(data.get("stream_options"), dict) else {}
        client_wants_usage = bool(options.get("include_usage")) if stream else True
        if stream_upstream:
            body["stream_options"] = {**options, "include_usage": True}  # usage feeds the engine back
        elif stream:
            body.pop("stream", None)
            body.pop("stream_options", None)
        cfg = LoopConfig(name, self.settings.recall_max_rounds, client_wants_usage)
        url = upstream.url("/chat/completions", request.url.query, turn.conversation_id)
        headers = upstream.forward_headers(request.headers)
        ctx = RecallContext(turn.tenant, turn.conversation_id, turn.state, turn.messages,
                            turn.extra.get("image_descriptions"))
        record = turn.record
        assert record is not None
        counter = self.resolver.counter
        # Recall rounds append to the prompt: what they add must fit in what the plan left free, plus half of the
        # window's safety margin (kept for estimate errors, which the learned correction ratio mostly removes; a
        # prompt near the high watermark would otherwise leave recall no room at all). Estimates are scaled by that
        # ratio, with a 5% margin.
        ratio = max(1.0, turn.state.correction_ratio)
        window = await self.services.context.window.tokens()
        spare = 0.5 * self.settings.safety_margin * window
        initial_room = max(0, int((0.95 * (turn.plan.budget + spare) - turn.plan.estimated_tokens) / ratio))
        room = [initial_room]

        async def send(round_body: dict[str, Any]):
            response, _ = await upstream.send("POST", url, headers, _encode(round_body))
            return response

        async def resolve(call: ToolCall) -> str:
            args = parse_arguments(call.arguments)
            if n > 1:  # each choice continues on its own: every one gets the whole room
                outcome = await self.resolver.resolve(ctx, args, limit=initial_room - counter.count_text(call.arguments or "") - 48)
            else:
                room[0] -= counter.count_text(call.arguments or "") + 48  # the assistant's call and its framing
                outcome = await self.resolver.resolve(ctx, args, limit=room[0])
                room[0] -= counter.count_text(outcome.text) + 8
            m.recall_calls.labels(outcome.kind).inc()
            record.kinds.append(outcome.kind)
            record.pages_recalled.extend(outcome.pages)
            if outcome.pages:
                m.recall_pages.inc(len(outcome.pages))
            if args.query:
                m.recall_search_seconds.observe(outcome.search_seconds)
            return outcome.text

        sent_at = time.perf_counter()
        m.proxy_overhead.labels("chat").observe(max(0.0, sent_at - started))
        first, waited = await upstream.send("POST", url, headers, _encode(body))
        out_headers = {**response_headers(first.headers), **extra_headers}
        out_headers.pop("Content-Type", None)
        content_type = first.headers.get("Content-Type", "")
        if first.status != 200 or (stream_upstream and not content_type.startswith("text/event-stream")):
            raw = await upstream.read_body(first)
            self._done(started, str(first.status))
            return Response(content=raw, status_code=first.status, media_type=content_type or None, headers=out_headers)

        if stream_upstream:
            def first_byte() -> None:
                m.upstream_ttft.observe(time.perf_counter() - sent_at)

            async def events():
                m.inflight_streams.inc()
                finished = False
                try:
                    async for event in stream_rounds(body, cfg, send, resolve, record, first, first_byte):
                        yield event
                    finished = True
                finally:
                    if not finished:
                        m.client_disconnects.inc()
                    m.inflight_streams.dec()
                    self._account(record)
                    self._done(started, "200")

            return Stream(events(), status_code=200, media_type="text/event-stream",
                          headers={**out_headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        m.upstream_ttft.observe(waited)
        raw = await upstream.read_body(first)
        status, _, content = await complete_json(body, cfg, send, upstream.read_body, resolve, record, first=(first, raw))
        self._account(record)
        self._done(started, str(status))
        if stream:  # n > 1 streamed: rounds were resolved per choice, now replayed as a stream
            data_out = _decode(content)
            return Stream(replay_as_stream(data_out, client_wants_usage), status_code=200,
                          media_type="text/event-stream", headers=out_headers)
        return Response(content=content, status_code=status, media_type="application/json", headers=out_headers)

    def _account(self, record) -> None:
        m = self.metrics
        m.observe_usage(record.usage)
        m.recall_rounds.observe(record.rounds)

    def _done(self, started: float, status: str) -> None:
        self.metrics.request_duration.labels("chat").observe(time.perf_counter() - started)
        self.metrics.requests.labels("chat", status).inc()
