"""In-process stand-ins for the turn service's ports: an in-memory repository (store/ports.py's contract, compare and
set included), an upstream over httpx.MockTransport, and a scripted chat upstream."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from memci_proxy.metrics import Metrics
from memci_proxy.settings import Settings
from memci_proxy.store.factory import Store
from memci_proxy.store.hot.memory import InProcessHotState
from memci_proxy.store.ports import (
    BEHIND, NOT_FOUND, REPLAYED, SAVED, STALE, ConversationConflict, ConversationNotFound, EntryRow, PageRow,
    SnapshotBehind, StaleState, TurnWrite, snapshot_digest,
)
from memci_proxy.turn.call import ChatCall, chat_call
from memci_proxy.turn.service import TurnService
from memci_proxy.upstream.exchange import Answer, Exchange


# --- the store of truth ---------------------------------------------------------------------------------------
@dataclass
class StoredConversation:
    tenant: str
    session_key: str | None
    parent_id: str | None
    state: bytes | None = None
    version: int = 0
    entries: dict[int, EntryRow] = field(default_factory=dict)
    pages: dict[str, PageRow] = field(default_factory=dict)
    hidden: dict[tuple[int, int], dict] = field(default_factory=dict)
    contents: dict[int, str] = field(default_factory=dict)
    events: list[Any] = field(default_factory=list)


class MemoryRepository:
    """Implements memci_proxy.store.ports.ConversationRepository in memory, with the same compare-and-set rules as the
    SQL repository. ``fail`` makes every write raise (a store that is down); ``delay`` slows writes down."""

    def __init__(self) -> None:
        self.conversations: dict[str, StoredConversation] = {}
        self.fingerprints: dict[tuple[str, str], tuple[str, int]] = {}
        self.fail: Exception | None = None
        self.delay = 0.0
        self.transactions = 0

    def _owned(self, tenant: str, conversation_id: str) -> StoredConversation | None:
        c = self.conversations.get(conversation_id)
        return c if c is not None and c.tenant == tenant else None

    async def create_conversation(self, tenant: str, conversation_id: str, session_key: str | None = None,
                                  parent_id: str | None = None, forked_at: int | None = None,
                                  end_user: str = "") -> None:
        if self.fail:
            raise self.fail
        existing = self.conversations.get(conversation_id)
        if existing is not None:
            if existing.tenant == tenant and existing.session_key == session_key:
                return
            raise ConversationConflict(conversation_id)
        c = self.conversations[conversation_id] = StoredConversation(tenant, session_key, parent_id)
        parent = self._owned(tenant, parent_id) if parent_id else None
        if parent is not None and forked_at:
            c.entries = {seq: e for seq, e in parent.entries.items() if seq < forked_at}

    async def find_by_session_key(self, tenant: str, session_key: str) -> str | None:
        return next((cid for cid, c in self.conversations.items() if c.tenant == tenant and c.session_key == session_key),
                    None)

    async def find_longest_prefix(self, tenant: str, chain_hashes: list[str]) -> tuple[str, int] | None:
        for i in range(len(chain_hashes) - 1, -1, -1):
            found = self.fingerprints.get((tenant, chain_hashes[i]))
            if found is not None:
                return found[0], i + 1
        return None

    async def save_turn(self, tenant: str, conversation_id: str, entries: list[EntryRow], pages: list[PageRow],
                        fingerprints: list[tuple[str, int]], snapshot: bytes, state_version: int, events: list,
                        contents: tuple[int, str] | None = None, hidden: Any = (), base: Any = None) -> None:
        outcome = (await self.save_turns([TurnWrite(tenant, conversation_id, snapshot, state_version, base,
                                                    list(entries), list(pages), list(fingerprints), list(events),
                                                    contents, list(hidden))]))[0]
        if outcome == NOT_FOUND:
            raise ConversationNotFound(conversation_id)
        if outcome == BEHIND:
            raise SnapshotBehind(conversation_id)
        if outcome == STALE:
            raise StaleState(conversation_id)

    async def save_turns(self, writes: list[TurnWrite]) -> list[str]:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise self.fail
        self.transactions += 1
        return [self._save(w) for w in writes]

    def _save(self, w: TurnWrite) -> str:
        c = self._owned(w.tenant, w.conversation_id)
        if c is None:
            return NOT_FOUND
        stored_digest = snapshot_digest(c.state) if c.state is not None else None
        if w.base is None:
            applies = c.version < w.version
        else:
            applies = c.version == w.base.version and stored_digest == w.base.digest
        if applies:
            outcome = SAVED
        elif c.version == w.version and stored_digest == snapshot_digest(w.snapshot):
            outcome = REPLAYED
        elif w.base is not None and c.version < w.base.version:
            return BEHIND
        else:
            return STALE
        c.state, c.version = w.snapshot, w.version
        for e in w.entries:
            if e.seq not in c.entries or c.entries[e.seq].hash != e.hash:
                c.entries[e.seq] = e
        for p in w.pages:
            c.pages[p.number] = p
        for chain_hash, length in w.fingerprints:
            self.fingerprints.setdefault((w.tenant, chain_hash), (w.conversation_id, length))
        for after, ordinal, message in w.hidden:
            c.hidden[(after, ordinal)] = message
        if w.contents is not None:
            c.contents[w.contents[0]] = w.contents[1]
        if outcome == SAVED:
            c.events.extend(w.events)
        return outcome

    async def load_snapshot(self, tenant: str, conversation_id: str) -> tuple[bytes, int] | None:
        if self.fail:
            raise self.fail
        c = self._owned(tenant, conversation_id)
        return None if c is None or c.state is None else (c.state, c.version)

    async def load_entries(self, tenant: str, conversation_id: str, first_seq: int, last_seq: int) -> list[EntryRow]:
        c = self._owned(tenant, conversation_id)
        return [] if c is None else [c.entries[s] for s in sorted(c.entries) if first_seq <= s <= last_seq]

    async def load_pages(self, tenant: str, conversation_id: str, states: tuple[str, ...] = ("archived", "evicted"),
                         after_seq: int | None = None) -> list[PageRow]:
        c = self._owned(tenant, conversation_id)
        after = -1 if after_seq is None else after_seq
        return [] if c is None else sorted((p for p in c.pages.values() if p.state in states and p.first_seq > after),
                                           key=lambda p: p.first_seq)

    async def update_recall_stats(self, tenant: str, conversation_id: str, numbers: list[str], turn: int) -> None:
        return None

    async def delete_conversation(self, tenant: str, conversation_id: str) -> bool:
        return self.conversations.pop(conversation_id, None) is not None

    async def ping(self) -> bool:
        return self.fail is None

    async def close(self) -> None:
        return None

    # what tests read
    def user_texts(self, conversation_id: str) -> list[str]:
        c = self.conversations[conversation_id]
        return [c.entries[s].message.get("content") for s in sorted(c.entries) if c.entries[s].role == "user"]


# --- the upstream -------------------------------------------------------------------------------------------
class _Body:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    async def iter_any(self) -> AsyncIterator[bytes]:
        if hasattr(self.response, "_content"):  # a mock's body, already in memory: in two pieces, as a network would
            content = self.response.content
            yield content[: len(content) // 2]
            yield content[len(content) // 2:]
            return
        async for chunk in self.response.aiter_raw():
            yield chunk


class _Response:
    """An httpx response in the shape of memci_proxy.upstream.port.UpstreamResponse."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status = response.status_code
        self.headers = response.headers
        self.content = _Body(response)

    async def read(self) -> bytes:
        return self.response.content if hasattr(self.response, "_content") else await self.response.aread()

    def release(self) -> None:
        return None

    def close(self) -> None:
        return None


class MockUpstream:
    """Implements memci_proxy.upstream.port.Upstream over httpx.MockTransport: ``handler(request) -> httpx.Response``."""

    def __init__(self, handler: Callable[[httpx.Request], Any]) -> None:
        self.client = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://upstream.test/v1")

    def url(self, path: str, query: str = "", route_key: str | None = None) -> str:
        return f"http://upstream.test/v1{path}" + (f"?{query}" if query else "")

    def forward_headers(self, incoming: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in incoming.items() if k.lower() not in ("host", "content-length")}

    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None) -> tuple[_Response, float]:
        started = time.perf_counter()
        request = self.client.build_request(method, url, headers=headers, content=body)
        response = await self.client.send(request, stream=True)
        return _Response(response), time.perf_counter() - started

    async def read_body(self, response: _Response) -> bytes:
        return await response.read()


@dataclass
class ChatUpstream:
    """A chat completions server: answers with a fixed text and usage (prompt tokens ~ characters / 4); a user message
    containing ``[[recall:<json args>]]`` gets a recall tool call first. Records every request body."""

    window: int = 4096
    requests: list[dict[str, Any]] = field(default_factory=list)
    on_request: Callable[[dict[str, Any]], None] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": self.window}]})
        if request.url.path.endswith(("/tokenize", "/tokenize/count")) or request.method == "GET":
            # an upstream without a tokenizer endpoint (OpenAI's shape), nor llama.cpp's routes
            return httpx.Response(404, json={"error": {"message": "not found"}})
        body = json.loads(request.content)
        self.requests.append(body)
        if self.on_request is not None:
            self.on_request(body)
        messages = body["messages"]
        prompt = sum(len(json.dumps(m)) for m in messages) // 4
        usage = {"prompt_tokens": prompt, "completion_tokens": 5, "total_tokens": prompt + 5}
        last = messages[-1]
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        message: dict[str, Any] = {"role": "assistant", "content": f"answer {len(self.requests)}"}
        finish = "stop"
        if last.get("role") == "user" and "[[recall:" in text:
            args = text.split("[[recall:", 1)[1].split("]]", 1)[0]
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{len(self.requests)}", "type": "function", "function": {"name": "recall", "arguments": args}}]}
            finish = "tool_calls"
        elif last.get("role") == "tool":
            message["content"] = "Tool result: " + (last.get("content") or "")[:200]
        data = {"id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
        if not body.get("stream"):
            return httpx.Response(200, json=data)
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=_sse(data))


def _sse(data: dict[str, Any]) -> bytes:
    message = data["choices"][0]["message"]
    base = {k: data[k] for k in ("id", "object", "created", "model")} | {"object": "chat.completion.chunk"}
    delta: dict[str, Any] = {"role": "assistant"}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(message["tool_calls"])]
    else:
        delta["content"] = message["content"]
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": data["choices"][0]["finish_reason"]}]},
        {**base, "choices": [], "usage": data["usage"]},
    ]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


# --- the service ----------------------------------------------------------------------------------------------
def settings(**overrides: Any) -> Settings:
    base = {"context_window": 4096, "embeddings_url": "", "embeddings_local": "off", "blob_store": "", "vision_model": "", "memory_workers": False,
            "write_behind_max_lag_ms": 5, "home": "/nonexistent"}
    fields = {f.name for f in dataclasses.fields(Settings)}
    return Settings(**{k: v for k, v in {**base, **overrides}.items() if k in fields})


def make_service(upstream: Any, repo: MemoryRepository | None = None, hot: Any = None, **overrides: Any) -> TurnService:
    metrics = Metrics()
    store = Store(repo=repo or MemoryRepository(), hot=hot or InProcessHotState(), kind_db="memory",
                  kind_hot="in-process", database_url="")
    service = TurnService(settings(**overrides), metrics, Exchange(MockUpstream(upstream), metrics), store)
    service.start()
    return service


def call_of(messages: list[dict[str, Any]], stream: bool = False, headers: Mapping[str, str] | None = None,
            **body: Any) -> ChatCall:
    data = {"model": "m", "messages": messages, "max_tokens": 64, **body}
    if stream:
        data["stream"] = True
    raw = json.dumps(data).encode()
    return chat_call(dict(headers or {"Authorization": "Bearer sk-unit"}), data, raw,
                     json.dumps(messages).encode(), started=time.perf_counter())


async def answer_of(answer: Answer) -> dict[str, Any] | list[bytes]:
    if answer.events is not None:
        return [event async for event in answer.events]
    return json.loads(answer.body)


class Chat:
    """A client that resends the whole history each turn, as chat clients do."""

    def __init__(self, service: TurnService, system: str = "You are terse.", words: int = 60,
                 headers: Mapping[str, str] | None = None) -> None:
        self.service = service
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self.words = words
        self.headers = headers
        self.conversation_id: str | None = None
        self.last_headers: dict[str, str] = {}
        self.tag = system  # chats differ by their messages, not by the system prompt (not part of the identity)

    def user_text(self, turn: int) -> str:
        return (f"Turn {turn} of {self.tag}: remember code{turn:04d}. "
                + " ".join(f"w{turn}x{i}" for i in range(self.words)))

    async def send(self, text: str, stream: bool = False) -> Any:
        self.messages.append({"role": "user", "content": text})
        answer = await self.service.handle(call_of(list(self.messages), stream, self.headers))
        self.last_headers = answer.headers
        self.conversation_id = answer.headers.get("X-Memci-Conversation-Id", self.conversation_id)
        out = await answer_of(answer)
        if isinstance(out, dict) and answer.status == 200:
            self.messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        elif isinstance(out, list):
            self.messages.append({"role": "assistant", "content": "streamed"})
        return out
