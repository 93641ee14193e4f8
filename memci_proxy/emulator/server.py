"""The emulator's raw ASGI application and its server (Granian)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import msgspec

from memci_proxy.emulator import apis
from memci_proxy.emulator.jsontext import encode as _encode
from memci_proxy.emulator.chat import ChatPlan, plan_chat, script_source
from memci_proxy.emulator.completions import completion_body, completion_stream_events, plan_completion
from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.emulator.embeddings import embeddings_body
from memci_proxy.emulator.errors import ErrorReply, bad_request
from memci_proxy.emulator.markers import Script, parse_markers
from memci_proxy.emulator.responses import MALFORMED_EVENT, chat_completion_body, chat_stream_events
from memci_proxy.emulator.state import EmulatorState

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

logger = logging.getLogger("memci_proxy.emulator")

_decode = msgspec.json.decode
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
_TEXT_HEADERS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]


class StreamAborted(Exception):
    """Raised inside a streaming response to drop the connection on purpose ([[abort:K]])."""


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body
    parts = [body]
    while message.get("more_body"):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


async def _send_bytes(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, payload: Any) -> None:
    await _send_bytes(send, status, _encode(payload), _JSON_HEADERS)


def _decode_body(raw: bytes) -> Any:
    try:
        return _decode(raw)
    except msgspec.DecodeError as error:
        try:  # JSON allows a lone surrogate escape ("\ud800"), which msgspec refuses and real servers accept
            return json.loads(raw)
        except ValueError:
            raise bad_request(f"malformed JSON body: {error}") from None


class EmulatorApp:
    """ASGI callable. All state lives in one process; request handling runs on its event loop."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.state = EmulatorState(config)
        self.responses_book = apis.ResponsesBook()
        self._routes: dict[tuple[str, str], Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            ("POST", "/v1/chat/completions"): self._chat_completions,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/responses"): self._responses,
            ("POST", "/v1/messages"): self._messages,
            ("POST", "/v1/messages/count_tokens"): self._count_tokens,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("POST", "/tokenize"): self._tokenize,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/health_generate"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/emulator/requests"): self._recent_requests,
            ("GET", "/emulator/stats"): self._stats,
            ("POST", "/emulator/reset"): self._reset,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                path = path[:-1]
            handler = self._routes.get((scope["method"], path))
            if handler is None:
                status = 405 if any(route_path == path for _, route_path in self._routes) else 404
                await _send_json(send, status, ErrorReply(status, f"no route for {scope['method']} {path}").body())
                return
            try:
                await handler(scope, receive, send)
            except ErrorReply as error:
                self.state.totals.errors += 1
                await _send_json(send, error.status, error.body())
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- generation ---------------------------------------------------------------------------

    async def _chat_completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = _decode_body(await _read_body(receive))
        state = self.state
        state.running += 1
        try:
            try:
                plan = plan_chat(state, body)
            except ErrorReply:
                _log_headers(state, body, scope)
                script_delay = _delay_of(body)
                if script_delay:
                    await asyncio.sleep(script_delay)
                raise
            _log_headers(state, body, scope)
            script = plan.script
            if plan.stream:
                events = chat_stream_events(plan, state.tokenizer, self.config.stream_chunk_tokens)
                await self._stream(receive, send, script, plan.time_to_first_token_s, plan.per_output_token_s, events)
                return
            wait = script.delay_s + plan.time_to_first_token_s + plan.per_output_token_s * plan.completion_tokens
            if wait > 0:
                await asyncio.sleep(wait)
            if script.bad_sse:
                await _send_bytes(send, 200, b'{"id": "chatcmpl-malformed", "choices": [', _JSON_HEADERS)
                return
            await _send_json(send, 200, chat_completion_body(plan))
        finally:
            state.running -= 1

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = _decode_body(await _read_body(receive))
        book = self.responses_book
        chat, conversation = apis.responses_chat(body, book.history(body))
        plan = await self._api_plan(scope, receive, send, chat, apis.response_body, apis.response_stream)
        if plan is not None and body.get("store") is not False:
            book.keep("resp_" + plan.request_id, conversation + apis.response_messages(plan))

    async def _messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            chat = apis.messages_chat(_decode_body(await _read_body(receive)))
            await self._api_plan(scope, receive, send, chat, apis.message_body, apis.message_stream)
        except ErrorReply as error:
            self.state.totals.errors += 1
            await _send_json(send, error.status, apis.anthropic_error(error.status, error.message))

    async def _count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        chat = apis.messages_chat({**_decode_body(await _read_body(receive)), "_count_only": True})
        prompt = "".join(self.state.render_chat_pieces(chat["messages"], chat.get("tools"), True))
        await _send_json(send, 200, {"input_tokens": self.state.tokenizer.count(prompt)})

    async def _api_plan(self, scope: Scope, receive: Receive, send: Send, chat: dict[str, Any],
                        whole: Callable[[ChatPlan], Any],
                        streamed: Callable[[ChatPlan, Any, int], list[tuple[bytes, int]]]) -> ChatPlan | None:
        """A Responses or Messages request planned as the chat it renders to, answered in that API's shape."""
        state = self.state
        state.running += 1
        try:
            plan = plan_chat(state, chat)
            _log_headers(state, chat, scope)
            script = plan.script
            if plan.stream:
                events = streamed(plan, state.tokenizer, max(1, self.config.stream_chunk_tokens))
                await self._stream(receive, send, script, plan.time_to_first_token_s, plan.per_output_token_s,
                                   events)
                return plan
            wait = script.delay_s + plan.time_to_first_token_s + plan.per_output_token_s * plan.completion_tokens
            if wait > 0:
                await asyncio.sleep(wait)
            await _send_json(send, 200, whole(plan))
            return plan
        finally:
            state.running -= 1

    async def _completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = _decode_body(await _read_body(receive))
        plan = plan_completion(self.state, body)
        if plan.stream:
            events = completion_stream_events(plan, self.config.stream_chunk_tokens)
            await self._stream(receive, send, plan.script, plan.time_to_first_token_s, plan.per_output_token_s, events)
            return
        wait = plan.script.delay_s + plan.time_to_first_token_s + plan.per_output_token_s * plan.completion_tokens
        if wait > 0:
            await asyncio.sleep(wait)
        await _send_json(send, 200, completion_body(plan))

    async def _stream(
        self,
        receive: Receive,
        send: Send,
        script: Script,
        first_token_s: float,
        per_token_s: float,
        events: list[tuple[bytes, int]],
    ) -> None:
        """Send ``events`` as a server-sent event stream, applying the latency model and stream faults.

        A client that goes away stops the stream (checked between events when the stream sleeps).
        """
        paced = per_token_s > 0 or script.slow_s > 0
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, gone)) if paced else None
        try:
            first_wait = script.delay_s + first_token_s
            if first_wait > 0:
                await asyncio.sleep(first_wait)
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            sent = 0
            for position, (event, token_count) in enumerate(events):
                if script.cut_after is not None and sent >= script.cut_after:
                    break
                if script.abort_after is not None and sent >= script.abort_after:
                    raise StreamAborted("stream aborted by an [[abort:K]] marker")
                if position > 0 and paced:
                    await asyncio.sleep(script.slow_s + per_token_s * token_count)
                    if gone.is_set():
                        return
                await send({"type": "http.response.body", "body": event, "more_body": True})
                sent += 1
                if script.bad_sse and position == 0:
                    await send({"type": "http.response.body", "body": MALFORMED_EVENT, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, ConnectionError) as error:  # the client went away
            logger.debug("stream ended early: %s", error)
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = _decode_body(await _read_body(receive))
        reply = embeddings_body(body, self.config.embedding_dim, self.config.model, self.state.tokenizer.count)
        self.state.totals.embeddings += 1
        await _send_json(send, 200, reply)

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        """SGLang's and vLLM's POST /tokenize: {"prompt": str | [str]} -> {"tokens", "count", "max_model_len"}."""
        body = _decode_body(await _read_body(receive))
        prompt = body.get("prompt") if isinstance(body, dict) else None
        tokenizer = self.state.tokenizer
        if isinstance(prompt, str):
            tokens: list = tokenizer.encode(prompt)
            count = len(tokens)
        elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            tokens = [tokenizer.encode(p) for p in prompt]
            count = [len(t) for t in tokens]
        else:
            raise bad_request("'prompt' must be a string or a list of strings", param="prompt")
        self.state.totals.tokenized_texts += 1 if isinstance(prompt, str) else len(prompt)
        await _send_json(send, 200, {"tokens": tokens, "count": count, "max_model_len": self.config.max_model_len})

    # --- information and inspection -------------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        config = self.config
        model = {
            "id": config.model,
            "object": "model",
            "created": int(self.state.started_at),
            "owned_by": "memci-emulator",
            "root": config.model,
            "max_model_len": config.max_model_len,
        }
        await _send_json(send, 200, {"object": "list", "data": [model]})

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, {"status": "ok"})

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_bytes(send, 200, self.state.prometheus_text().encode(), _TEXT_HEADERS)

    async def _recent_requests(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            count = int(query.get("n", [str(self.config.request_log_size)])[0])
        except ValueError:
            raise bad_request("'n' must be an integer", param="n") from None
        await _send_json(send, 200, {"object": "list", "data": self.state.last_requests(count)})

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_json(send, 200, self.state.stats())

    async def _reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _read_body(receive)
        self.state.reset()
        await _send_json(send, 200, {"status": "reset"})


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            gone.set()
            return


def _log_headers(state: EmulatorState, body: Any, scope: Scope) -> None:
    """The request's own X-* headers (routing and affinity headers a proxy adds) and its Authorization (which key a
    proxy's own jobs carry) go into its log record."""
    if state.recent and state.recent[-1].get("body") is body:
        state.recent[-1]["headers"] = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name.lower().startswith(b"x-") or name.lower() == b"authorization"
        }


def _delay_of(body: Any) -> float:
    """The [[delay:S]] of a request that is answered with an error (so that faults can be slow too)."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return 0.0
    messages = [message for message in body["messages"] if isinstance(message, dict)]
    return parse_markers(script_source(messages)[0]).delay_s


def create_app(config: EmulatorConfig | None = None) -> EmulatorApp:
    return EmulatorApp(config or EmulatorConfig())


def _load_app(config: EmulatorConfig) -> EmulatorApp:
    return create_app(config)


def run(config: EmulatorConfig) -> None:
    """Serve the emulator with Granian (one worker, one runtime thread); blocks until stopped."""
    from granian.constants import Interfaces
    from granian.server import Server

    server = Server(
        "memci_proxy.emulator.server:create_app",
        address=config.host,
        port=config.port,
        interface=Interfaces.ASGI,
        workers=1,
        runtime_threads=1,
        log_access=False,
        backlog=2048,
        websockets=False,
    )
    server.serve(target_loader=functools.partial(_load_app, config), wrap_loader=False)
