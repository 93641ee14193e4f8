"""The server-side recall loop: the upstream calls `recall`, the proxy answers and asks again; the client sees one
ordinary completion (one id, one role delta, usage summed over the rounds) and never a recall call.

Mixed answers (recall and client tools in one message): the client gets its own calls (renumbered); the recall
exchange is kept as hidden messages that the engine splices in before that message on later turns.

Each finished exchange (the assistant's recall call and the tool results) is handed to ``keep`` before the next
round goes upstream: the managed turn stores it durably there, since the client never resends it. The rounds start
from ``body["messages"]``: a caller may end that list with an exchange of its own (a recall the proxy ran before
the first upstream call) and the loop carries on from it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from memci_proxy.recall.tool.rounds import LoopRecord, ToolCall, add_usage, assistant_call_message, tool_result_message
from memci_proxy.recall.tool.schema import inject
from memci_proxy.wire.errors import error_body
from memci_proxy.wire.sse import DONE, SSESplitter, cut_stream_event, encode_data, event_data

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode

Send = Callable[[dict[str, Any]], Awaitable[aiohttp.ClientResponse]]
Resolve = Callable[[ToolCall], Awaitable[str]]
ReadBody = Callable[[aiohttp.ClientResponse], Awaitable[bytes]]
Keep = Callable[[list[dict[str, Any]]], Awaitable[None]]


async def _keep_nothing(exchange: list[dict[str, Any]]) -> None:
    return None


@dataclass
class LoopConfig:
    recall_name: str
    max_rounds: int
    client_wants_usage: bool
    stream_upstream: bool = False  # rounds are streamed (the client streams with n = 1)
    answer_now: bool = False  # set by the resolver when the prompt has no room left: the next round must answer
    # The max_tokens of a later round (the prompt grew by the rounds before it: the answer's room shrank), None: as
    # the first round's.
    answer_limit: Callable[[], int | None] | None = None


def prepare_rounds(
    data: dict[str, Any], messages: list[dict[str, Any]], tool_name: str, max_rounds: int, stream: bool
) -> tuple[dict[str, Any], LoopConfig]:
    """The first round's body (the client's request with the planned messages and the recall tool) and the loop's
    settings. A streamed round always asks for usage (it feeds the engine back); n > 1 is resolved whole and
    replayed as a stream."""
    body, name = inject({**data, "messages": messages}, tool_name)
    n = data.get("n") or 1
    stream_upstream = stream and n == 1
    options = data.get("stream_options") if isinstance(data.get("stream_options"), dict) else {}
    client_wants_usage = bool(options.get("include_usage")) if stream else True
    if stream_upstream:
        body["stream_options"] = {**options, "include_usage": True}
    elif stream:
        body.pop("stream", None)
        body.pop("stream_options", None)
    return body, LoopConfig(name, max_rounds, client_wants_usage, stream_upstream)


def _call_name(call: dict[str, Any]) -> str | None:
    fn = call.get("function") if isinstance(call, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


def _to_call(call: dict[str, Any]) -> ToolCall:
    fn = call.get("function") or {}
    return ToolCall(str(call.get("id") or f"call_{uuid.uuid4().hex[:24]}"), str(fn.get("name")), str(fn.get("arguments") or ""))


def _round_body(body: dict[str, Any], messages: list[dict[str, Any]], round_no: int, cfg: LoopConfig) -> dict[str, Any]:
    out = {**body, "messages": messages}
    limit = cfg.answer_limit() if round_no > 0 and cfg.answer_limit is not None else None
    if limit is not None:
        out.update({key: limit for key in ("max_completion_tokens", "max_tokens") if out.get(key) is not None})
    if round_no > 0 and (round_no >= cfg.max_rounds or cfg.answer_now):
        out["tool_choice"] = "none"  # rounds used up: the model must answer with what it has
    return out


async def _answer_calls(calls: list[ToolCall], resolve: Resolve) -> list[dict[str, Any]]:
    return [tool_result_message(call, await resolve(call)) for call in calls]


# ------------------------------------------------------------------------------------------------------------
# Non-streaming
# ------------------------------------------------------------------------------------------------------------
async def complete_json(
    body: dict[str, Any], cfg: LoopConfig, send: Send, read: ReadBody, resolve: Resolve, record: LoopRecord,
    first: tuple[aiohttp.ClientResponse, bytes] | None = None, keep: Keep = _keep_nothing,
) -> tuple[int, dict[str, str], bytes]:
    """Run the rounds; return (status, upstream headers, body) of the answer the client gets."""
    messages = list(body["messages"])
    contents: list[str] = []
    first_data: dict[str, Any] | None = None
    for round_no in range(cfg.max_rounds + 1):
        if first is not None and round_no == 0:
            response, raw = first
        else:
            response = await send(_round_body(body, messages, round_no, cfg))
            raw = await read(response)
        headers = dict(response.headers)
        if response.status != 200:
            return response.status, headers, raw
        data = _decode(raw)
        record.observe_usage(data.get("usage"))
        if first_data is None:
            first_data = data
        choices = data.get("choices") or []
        if len(choices) != 1:
            return 200, headers, _encode(
                await _complete_choices(data, body, messages, cfg, send, read, resolve, record, keep))
        choice = choices[0]
        message = choice.get("message") or {}
        calls = message.get("tool_calls") or []
        recall = [_to_call(c) for c in calls if _call_name(c) == cfg.recall_name]
        if not recall:
            if round_no == 0:
                return 200, headers, raw  # no round ran: the upstream's answer byte for byte
            return 200, headers, _encode(_final(first_data, data, contents, record))
        client_calls = [c for c in calls if _call_name(c) != cfg.recall_name]
        results = await _answer_calls(recall, resolve)
        exchange = [assistant_call_message(None, recall), *results]
        record.hidden.extend(exchange)
        record.rounds += 1
        await keep(exchange)
        if client_calls or round_no >= cfg.max_rounds:
            message = {**message, "tool_calls": client_calls or None}
            if not client_calls:
                message.pop("tool_calls")
                choice = {**choice, "finish_reason": "stop"}
            data = {**data, "choices": [{**choice, "message": message}]}
            return 200, headers, _encode(_final(first_data, data, contents, record))
        if isinstance(message.get("content"), str) and message["content"]:
            contents.append(message["content"])
        messages.extend(exchange)
    raise AssertionError("unreachable")  # the last round always returns


def _final(first: dict[str, Any], data: dict[str, Any], contents: list[str], record: LoopRecord) -> dict[str, Any]:
    out = {**data, "id": first.get("id", data.get("id")), "created": first.get("created", data.get("created"))}
    if record.usage is not None:
        out["usage"] = record.usage
    if contents:
        choice = out["choices"][0]
        message = dict(choice.get("message") or {})
        message["content"] = "".join(contents) + (message.get("content") or "")
        out["choices"] = [{**choice, "message": message}]
    return out


async def _complete_choices(
    data: dict[str, Any], body: dict[str, Any], messages: list[dict[str, Any]], cfg: LoopConfig, send: Send,
    read: ReadBody, resolve: Resolve, record: LoopRecord, keep: Keep,
) -> dict[str, Any]:
    """n > 1: every choice that called recall is completed by its own follow-up rounds (n=1); the hidden
    exchange kept for later turns is the one of the first such choice."""
    choices = []
    kept_hidden = False
    for choice in data.get("choices") or []:
        message = choice.get("message") or {}
        calls = message.get("tool_calls") or []
        recall = [_to_call(c) for c in calls if _call_name(c) == cfg.recall_name]
        client_calls = [c for c in calls if _call_name(c) != cfg.recall_name]
        if not recall:
            choices.append(choice)
            continue
        results = await _answer_calls(recall, resolve)
        exchange = [assistant_call_message(None, recall), *results]
        if not kept_hidden:
            await keep(exchange)  # the first such choice's exchange is the one later turns see
        sub = LoopRecord()
        if client_calls:
            message = {**message, "tool_calls": client_calls}
            choices.append({**choice, "message": message})
        else:
            follow = {**body, "n": 1}
            status, _, raw = await complete_json(
                {**follow, "messages": [*messages, *exchange]}, LoopConfig(cfg.recall_name, max(0, cfg.max_rounds - 1), True),
                send, read, resolve, sub, keep=keep if not kept_hidden else _keep_nothing,
            )
            if status != 200:
                choices.append({**choice, "message": {"role": "assistant", "content": ""}, "finish_reason": "stop"})
            else:
                answer = _decode(raw)["choices"][0]
                choices.append({**answer, "index": choice.get("index", len(choices))})
        record.usage = add_usage(record.usage, sub.usage)
        if not kept_hidden:
            record.hidden.extend([*exchange, *sub.hidden])
            kept_hidden = True
        record.rounds = max(record.rounds, 1 + sub.rounds)
    out = {**data, "choices": choices}
    if record.usage is not None:
        out["usage"] = record.usage
    return out


# ------------------------------------------------------------------------------------------------------------
# Streaming (n = 1)
# ------------------------------------------------------------------------------------------------------------
class _StreamRound:
    """Filters one upstream round's chunks: content and client tool calls go on, recall calls are collected."""

    def __init__(self, cfg: LoopConfig, first_id: str | None, created: int | None, send_role: bool, next_client: int):
        self.cfg = cfg
        self.first_id = first_id
        self.created = created
        self.send_role = send_role
        self.next_client = next_client
        self.recall: dict[int, ToolCall] = {}
        self.client: dict[int, int] = {}
        self.finish: str | None = None
        self.template: dict[str, Any] | None = None
        self.error: bytes | None = None
        self.text: list[str] = []  # the content's pieces
        self.plain = True  # nothing but content (no reasoning, no other fields)

    def feed(self, chunk: dict[str, Any], record: LoopRecord) -> dict[str, Any] | None:
        if "error" in chunk:
            self.error = _encode(chunk)
            return None
        if self.first_id is None:
            self.first_id, self.created = chunk.get("id"), chunk.get("created")
        record.observe_usage(chunk.get("usage"))
        choices = chunk.get("choices") or []
        if not choices:
            return None
        self.template = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
        choice = choices[0]
        delta = choice.get("delta") or {}
        out: dict[str, Any] = {}
        for key, value in delta.items():
            if key == "role":
                if self.send_role:
                    out["role"] = value
                    self.send_role = False
            elif key == "tool_calls":
                forwarded = self._tool_calls(value or [])
                if forwarded:
                    out["tool_calls"] = forwarded
            elif value is not None and value != "":
                out[key] = value
                if key == "content" and isinstance(value, str):
                    self.text.append(value)
                else:
                    self.plain = False
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        if not out:
            return None
        return {**self.template, "id": self.first_id, "created": self.created,
                "choices": [{"index": 0, "delta": out, "logprobs": choice.get("logprobs"), "finish_reason": None}]}

    def _tool_calls(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        forwarded = []
        for tc in deltas:
            idx = tc.get("index", 0)
            fn = tc.get("function") or {}
            if idx not in self.recall and idx not in self.client:
                if fn.get("name") == self.cfg.recall_name:
                    self.recall[idx] = ToolCall(str(tc.get("id") or f"call_{uuid.uuid4().hex[:24]}"), self.cfg.recall_name)
                else:
                    self.client[idx] = self.next_client
                    self.next_client += 1
            if idx in self.recall:
                self.recall[idx].arguments += fn.get("arguments") or ""
            else:
                forwarded.append({**tc, "index": self.client[idx]})
        return forwarded

    def closing(self, finish: str) -> dict[str, Any]:
        base = self.template or {"object": "chat.completion.chunk"}
        return {**base, "id": self.first_id, "created": self.created,
                "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}]}


async def _chunks(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any] | bytes]:
    """Decoded chunks of one upstream stream; undecodable events come through as raw bytes."""
    splitter = SSESplitter()
    try:
        async for piece in response.content.iter_any():
            for event in splitter.feed(piece):
                data = event_data(event)
                if data is None:
                    continue
                if data == b"[DONE]":
                    return
                try:
                    yield _decode(data)
                except msgspec.DecodeError:
                    yield event
    finally:
        response.close()


async def stream_rounds(
    body: dict[str, Any], cfg: LoopConfig, send: Send, resolve: Resolve, record: LoopRecord,
    first: aiohttp.ClientResponse, on_first_byte: Callable[[], None] | None = None, keep: Keep = _keep_nothing,
) -> AsyncIterator[bytes]:
    messages = list(body["messages"])
    response = first
    send_role = True
    next_client = 0
    first_id: str | None = None
    created: int | None = None
    for round_no in range(cfg.max_rounds + 1):
        if round_no > 0:
            response = await send(_round_body(body, messages, round_no, cfg))
            if response.status != 200:
                detail = (await response.read())[:300].decode(errors="replace")
                response.close()
                record.failure = ("http_5xx" if response.status >= 500 else "http_4xx", response.status,
                                  f"recall round {round_no}")
                yield encode_data(error_body(f"upstream failed during recall: {response.status} {detail}",
                                             "upstream_error", "upstream_error"))
                yield DONE
                return
        rnd = _StreamRound(cfg, first_id, created, send_role, next_client)
        try:
            async for chunk in _chunks(response):
                if on_first_byte is not None:
                    on_first_byte()
                    on_first_byte = None
                if isinstance(chunk, bytes):
                    yield chunk  # not ours to judge: pass it on
                    continue
                out = rnd.feed(chunk, record)
                if rnd.error is not None:
                    record.failure = ("stream_error", 200, "an error event")
                    yield encode_data(rnd.error)
                    yield DONE
                    return
                if out is not None:
                    yield encode_data(_encode(out))
        except (aiohttp.ClientError, TimeoutError) as exc:  # a cut body, a reset, a disconnect, a time-out
            # (memci_proxy.upstream.relay.relay_sse reads the same exceptions as a cut)
            record.failure = ("stream_cut", 200, type(exc).__name__)
            yield cut_stream_event(type(exc).__name__)
            yield DONE
            return
        first_id, created, send_role, next_client = rnd.first_id, rnd.created, rnd.send_role, rnd.next_client
        if rnd.finish is None:
            record.failure = ("stream_cut", 200, "no finish_reason")
            yield cut_stream_event("no finish_reason")
            yield DONE
            return
        recall = list(rnd.recall.values())
        if recall:
            results = await _answer_calls(recall, resolve)
            exchange = [assistant_call_message(None, recall), *results]
            record.hidden.extend(exchange)
            record.rounds += 1
            await keep(exchange)
            if not rnd.client and round_no < cfg.max_rounds:
                messages.extend(exchange)
                continue
        if round_no == 0 and not recall and not rnd.client and rnd.plain and rnd.finish in ("stop", "length"):
            record.streamed_text = "".join(rnd.text)
        finish = "tool_calls" if rnd.client else ("stop" if rnd.finish == "tool_calls" else rnd.finish)
        yield encode_data(_encode(rnd.closing(finish)))
        if cfg.client_wants_usage and record.usage is not None:
            closing = rnd.closing(finish)
            closing["choices"] = []
            closing["usage"] = record.usage
            yield encode_data(_encode(closing))
        yield DONE
        return


async def replay_as_stream(data: dict[str, Any], client_wants_usage: bool) -> AsyncIterator[bytes]:
    """A finished completion as a stream (used for n > 1 with recall, where rounds are resolved per choice)."""
    base = {"id": data.get("id"), "object": "chat.completion.chunk", "created": data.get("created", int(time.time())),
            "model": data.get("model")}
    for choice in data.get("choices") or []:
        message = choice.get("message") or {}
        index = choice.get("index", 0)
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(message["tool_calls"])]
        yield encode_data(_encode({**base, "choices": [{"index": index, "delta": delta, "finish_reason": None}]}))
        yield encode_data(_encode({**base, "choices": [{"index": index, "delta": {}, "finish_reason": choice.get("finish_reason")}]}))
    if client_wants_usage and data.get("usage") is not None:
        yield encode_data(_encode({**base, "choices": [], "usage": data["usage"]}))
    yield DONE
