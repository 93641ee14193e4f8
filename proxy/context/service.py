"""One managed chat turn, end to end (DESIGN.md section 3).

identity -> session lock -> state (hot, else PostgreSQL) -> engine.plan -> durable writes that must precede
the upstream call -> upstream (relay) -> usage feedback -> state saved -> lock released.
Any failure of the engine or the store before the upstream call sends the client's request unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from litestar import Request, Response
from litestar.response import Stream

from proxy.api.forwarding import forward
from proxy.api.services import Services
from proxy.context.identity import (
    conversation_id_for_session,
    new_conversation_id,
    session_key_of,
    split_system,
    tenant_of,
)
from proxy.context.persist import turn_rows
from proxy.context.trimming import trim_to_budget
from proxy.context.window import ContextWindow
from proxy.context.recall_path import RecallPath
from proxy.context.volatile import VolatileContext
from proxy.recall.resolver import RecallResolver
from proxy.recall.vector_index import build_page_vectors
from proxy.recall.tool import recall_tool
from proxy.engine import (
    ConversationState,
    EngineConfig,
    EstimateCounter,
    Plan,
    TurnInput,
    add_hidden,
    chain_hashes,
    entry_hashes,
    observe_usage,
    plan,
    record_recall,
)
from proxy.recall.rounds import LoopRecord
from proxy.blobs import make_blob_store
from proxy.vision import intake_images, make_describer
from proxy.store.ports import LockTimeout, StaleState
from proxy.wire.errors import ProxyError

log = logging.getLogger("memci.context")
_encode = msgspec.json.Encoder().encode
_HOT_TTL = 24 * 3600.0
# The session lock: the lease (renewed every third of it while held) and the longest wait for a conversation's
# previous request. The wait outlasts the lease, so a crashed holder's lock always expires within one wait.
LOCK_LEASE_S = 15.0
LOCK_WAIT_S = 20.0


class StoreUnavailable(Exception):
    """The store of truth refused a read or write the turn needs before the upstream call."""


class _RawMessages(msgspec.Struct):
    messages: msgspec.Raw


_raw_messages = msgspec.json.Decoder(_RawMessages).decode


def raw_messages_of(body: bytes) -> bytes | None:
    """The request's `messages` array exactly as sent: lets the engine recognise the known prefix by its bytes."""
    try:
        return bytes(_raw_messages(body).messages)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


@dataclass
class Turn:
    """What one request learned and decided, carried from planning to the end of the answer."""

    tenant: str
    conversation_id: str
    how: str  # "session_key" | "prefix" | "new" | "fork"
    state: ConversationState
    plan: Plan
    chains: list[str]
    known_prefix: int
    parent_id: str | None = None
    last_index: int = -1  # index of the request's last non-system message (hidden messages go after it)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the request's non-system messages
    record: LoopRecord | None = None  # what the recall rounds did
    usage: dict[str, Any] | None = None
    durable_saved: bool = False
    version: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LastPrompt:
    messages: list[dict[str, Any]]
    blocks: list[Any]
    epoch: bool
    at: float


class ContextService:
    def __init__(self, services: Services) -> None:
        self.services = services
        self.settings = services.settings
        self.store = services.store
        self.metrics = services.metrics
        self.counter = EstimateCounter()
        self.window = ContextWindow(services.settings, services.upstream)
        s = services.settings
        vectors = build_page_vectors(services.store.repo, s.embeddings_url, s.upstream_url, s.embeddings_model,
                                     s.embeddings_api_key, s.embeddings_timeout)
        self.resolver = RecallResolver(
            services.store.repo, self.counter, s.recall_max_tokens, vectors=vectors, metrics=services.metrics,
            lexical_weight=s.recall_lexical_weight, vector_weight=s.recall_vector_weight, min_cosine=s.recall_min_cosine,
        )
        self.recall = RecallPath(services, self.resolver) if services.settings.recall_enabled else None
        self.volatile = VolatileContext(services.settings, services.metrics, self.resolver, services.upstream.session)
        self.last_prompts: OrderedDict[str, LastPrompt] = OrderedDict()
        self._engine_configs: dict[int, EngineConfig] = {}
        self.blobs = make_blob_store(services.settings)
        self.describer = make_describer(services.settings, self.blobs)
        # The upstream's tokens per estimated token, as the last planned turn learned it (trimming uses it).
        self.fallback_ratio = 1.0

    def _engine_config(self, window: int) -> EngineConfig:
        """The engine's configuration for a context window (settings are fixed for the process's life)."""
        config = self._engine_configs.get(window)
        if config is None:
            config = self._engine_configs[window] = EngineConfig.from_settings(self.settings, window)
        return config

    async def close(self) -> None:
        await self.volatile.close()
        await self.resolver.close()
        await self.describer.close()
        await self.blobs.close()

    # ------------------------------------------------------------------------------------------------
    async def handle(self, request: Request, data: dict[str, Any], body: bytes, started: float) -> Response:
        headers = request.headers
        stream = data.get("stream") is True
        tenant = tenant_of(headers)
        system, messages = split_system(data["messages"])
        session_key = session_key_of(headers, data)
        try:
            # The prefix chain identifies a conversation without an explicit key; with one it is not needed.
            chains = [] if session_key else chain_hashes(entry_hashes(messages))
            conversation_id, how, known = await self._identify(tenant, session_key, chains)
        except Exception:
            log.exception("conversation lookup failed; forwarding without context management")
            self.metrics.engine_errors.labels("identify").inc()
            return await self._fallback(request, data, body, started, stream, system, messages)

        lock = self.store.hot.lock(conversation_id, LOCK_WAIT_S, LOCK_LEASE_S)
        waiting = time.perf_counter()
        try:
            await lock.__aenter__()
        except LockTimeout:
            self.metrics.lock_wait.observe(time.perf_counter() - waiting)
            self.metrics.lock_timeouts.inc()
            raise ProxyError(
                409, "another request of this conversation is still running", "conflict_error", "session_locked",
                headers={"Retry-After": "1"},
            ) from None
        except Exception:
            log.exception("session lock failed; forwarding without context management")
            self.metrics.engine_errors.labels("lock").inc()
            return await self._fallback(request, data, body, started, stream, system, messages)
        self.metrics.lock_wait.observe(time.perf_counter() - waiting)
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                with anyio.CancelScope(shield=True):
                    await lock.__aexit__(None, None, None)

        try:
            turn = await self._plan(tenant, conversation_id, how, known, data, system, messages, chains, body, headers)
        except StoreUnavailable:  # nothing may leave the prompt unstored: no archiving, a trimmed request
            await release()
            self.metrics.store_write_failures.labels("plan").inc()
            return await self._fallback(request, data, body, started, stream, system, messages)
        except Exception:
            await release()
            log.exception("planning failed; forwarding unchanged")
            self.metrics.engine_errors.labels("plan").inc()
            return await self._fallback(request, data, body, started, stream, system, messages)

        extra_headers = self._response_headers(turn)
        if self.recall is not None:
            turn.record = LoopRecord()
            try:
                response = await self.recall.run(request, data, turn, stream, started, extra_headers)
            except (ProxyError, asyncio.CancelledError):
                await self._finish(turn)
                await release()
                raise
            except BaseException as exc:
                await self._finish(turn)
                await release()
                if not isinstance(exc, Exception):
                    raise
                log.exception("the recall rounds failed")
                self.metrics.engine_errors.labels("recall").inc()
                raise ProxyError(502, f"the upstream's answer could not be read: {type(exc).__name__}",
                                 "upstream_error", "upstream_malformed") from None
            return await self._settle(response, turn, release)

        upstream_body = _encode({**data, "messages": turn.plan.messages})

        def on_usage(usage: dict[str, Any]) -> None:
            turn.usage = usage

        try:
            response = await forward(
                self.services, "chat", "POST", "/chat/completions", request.url.query, headers, upstream_body,
                started, expect_stream=stream, extra_headers=extra_headers, on_usage=on_usage,
                route_key=conversation_id,
            )
        except BaseException:
            await self._finish(turn)
            await release()
            raise
        return await self._settle(response, turn, release)

    async def _settle(self, response: Response, turn: Turn, release) -> Response:
        """Finish the turn (usage feedback, the turn stored, the lock released) once the answer is out: now for
        a complete answer, after the last event for a stream."""
        if isinstance(response, Stream):
            response.iterator = self._finish_after(response.iterator, turn, release)
            return response
        try:
            await self._finish(turn)
        finally:
            await release()
        return response

    async def _finish_after(self, events, turn: Turn, release) -> Any:
        try:
            async for event in events:
                yield event
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self._finish(turn)
                finally:
                    await release()

    # ------------------------------------------------------------------------------------------------
    async def _identify(self, tenant: str, session_key: str | None, chains: list[str]) -> tuple[str, str, int]:
        """(conversation id, how it was found, number of leading messages already known)."""
        if session_key:
            return conversation_id_for_session(tenant, session_key), "session_key", -1
        if not chains:
            return new_conversation_id(), "new", 0
        hot = self.store.hot
        # The usual case: everything but the newest answer and user message is known.
        for back in range(1, min(4, len(chains)) + 1):
            hit = await hot.get_fingerprint(tenant, chains[-back])
            if hit is not None:
                return hit[0], "prefix", len(chains) - back + 1
        found = await self.store.repo.find_longest_prefix(tenant, chains)
        if found is None:
            return new_conversation_id(), "new", 0
        return found[0], "prefix", found[1]

    async def _load_state(self, tenant: str, conversation_id: str, fresh: bool = False
                          ) -> tuple[ConversationState | None, int]:
        """The newest state: the hot copy, else (or with ``fresh``) the store of truth's."""
        if not fresh:
            hot = await self.store.hot.get_snapshot(conversation_id)
            if hot is not None:
                try:
                    return ConversationState.from_bytes(hot[0]), hot[1]
                except Exception:  # an unreadable hot copy (another version, corruption): the database's instead
                    log.exception("conversation %s: unreadable hot snapshot; loading it from the database",
                                  conversation_id)
                    self.metrics.engine_errors.labels("hot_snapshot").inc()
        try:
            stored = await self.store.repo.load_snapshot(tenant, conversation_id)
        except Exception as exc:
            log.warning("could not load conversation %s from the database: %s", conversation_id, exc)
            raise StoreUnavailable(str(exc)) from exc
        if stored is None or stored[0] is None:
            return None, 0
        return ConversationState.from_bytes(stored[0]), stored[1]

    async def _plan(
        self,
        tenant: str,
        conversation_id: str,
        how: str,
        known: int,
        data: dict[str, Any],
        system: list[dict[str, Any]],
        messages: list[dict[str, Any]],
        chains: list[str],
        body: bytes,
        headers: Any,
    ) -> Turn:
        """Load, plan, and store what must be durable before the upstream sees the prompt.

        Raises StoreUnavailable when the store of truth cannot take it. A stored version newer than the one loaded
        (another replica wrote meanwhile: StaleState) reloads the state from the database and plans once more.
        """
        first_how = how
        for attempt in (0, 1):
            turn = await self._plan_once(tenant, conversation_id, first_how, known, data, system, messages, chains,
                                         body, headers, fresh=attempt > 0)
            if not turn.plan.archived:
                break
            # The archived pages leave the prompt now: they must be durable first.
            try:
                await self._save(turn, turn.plan.state)
                turn.durable_saved = True
                break
            except StaleState:
                if attempt:
                    raise StoreUnavailable("the stored state kept changing") from None
                log.warning("conversation %s: a newer state was stored meanwhile; planning again from it",
                            conversation_id)
                self.metrics.engine_errors.labels("stale_state").inc()
            except Exception as exc:
                log.warning("could not store archived pages (%s): no archiving this turn", exc)
                raise StoreUnavailable(str(exc)) from exc
        self._remember_prompt(turn.conversation_id, turn.plan)
        return turn

    async def _plan_once(
        self, tenant: str, conversation_id: str, how: str, known: int, data: dict[str, Any],
        system: list[dict[str, Any]], messages: list[dict[str, Any]], chains: list[str], body: bytes, headers: Any,
        fresh: bool = False,
    ) -> Turn:
        repo = self.store.repo
        state: ConversationState | None = None
        version = 0
        parent_id: str | None = None
        if how != "new":
            state, version = await self._load_state(tenant, conversation_id, fresh)
            if how == "prefix" and state is not None and known < len(state.hashes):
                # An edit or a regeneration: continue in a fork, leaving the original untouched.
                parent_id, conversation_id, how, version = conversation_id, new_conversation_id(), "fork", 0
        try:
            if state is None and how in ("new", "fork", "session_key"):
                await repo.create_conversation(
                    tenant, conversation_id, session_key=None if how != "session_key" else conversation_id,
                    parent_id=parent_id, forked_at=known if how == "fork" else None,
                )
            elif how == "fork":
                await repo.create_conversation(tenant, conversation_id, parent_id=parent_id, forked_at=known)
        except Exception as exc:
            log.warning("could not create conversation %s in the database: %s", conversation_id, exc)
            raise StoreUnavailable(str(exc)) from exc
        if not fresh:
            self.metrics.conversations.labels(how).inc()

        window = await self.window.tokens()
        config = self._engine_config(window)
        tools = list(data.get("tools") or [])
        if self.recall is not None:
            tools.append(recall_tool(self.settings.recall_tool_name))  # what the upstream will get
        tools_tokens = self.counter.count_text(_encode(tools).decode()) if tools else 0
        max_tokens = data.get("max_completion_tokens") or data.get("max_tokens")
        volatile = await self.volatile.blocks(headers, tenant, conversation_id, state, messages)
        memory = self.services.memory
        summary = await memory.latest_summary(tenant, conversation_id) if memory and state is not None else ""
        profile = await memory.latest_profile(tenant) if memory is not None else ""
        turn_input = TurnInput(
            summary=summary, profile=profile,
            intent=volatile.intent, memory=volatile.memory,
            system=system, messages=messages, tools_tokens=tools_tokens,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None, now=time.time(),
            raw_messages=raw_messages_of(body),
            image_descriptions=self.describer.descriptions,
        )
        result = plan(state, turn_input, config, self.counter)
        await self._intake_images(result)
        turn = Turn(
            tenant=tenant, conversation_id=conversation_id, how=how, state=result.state, plan=result,
            chains=chains, known_prefix=max(known, 0),
            parent_id=parent_id, version=version, last_index=len(messages) - 1, messages=messages,
        )
        turn.extra["input"] = turn_input
        turn.extra["image_descriptions"] = self.describer.descriptions
        self.fallback_ratio = max(1.0, float(result.state.correction_ratio or 1.0))
        turn.extra["config"] = config
        self._count_plan(result)
        return turn

    async def _intake_images(self, result: Plan) -> None:
        """New messages' data: images to the blob store (once per hash), descriptions started; the entries
        rows keep blob references instead of the bytes."""
        if not any(isinstance(m.get("content"), list) for _, m, _, _ in result.new_entries):
            return
        stored = await intake_images([m for _, m, _, _ in result.new_entries], self.blobs, self.describer)
        result.new_entries = [(i, s, d, t) for (i, _, d, t), s in zip(result.new_entries, stored)]

    async def _save(self, turn: Turn, state: ConversationState, hidden: list[dict[str, Any]] = (),
                    recalled: list[str] = ()) -> None:
        rows = turn_rows(turn.tenant, turn.conversation_id, turn.plan, state, turn.chains, turn.known_prefix,
                         also_pages=recalled)
        turn.version += 1
        snapshot = state.to_bytes()
        await self.store.repo.save_turn(
            turn.tenant, turn.conversation_id, rows.entries, rows.pages, rows.fingerprints, snapshot, turn.version,
            rows.events, contents=rows.contents,
            hidden=[(turn.last_index, i, m) for i, m in enumerate(hidden)],
        )
        await self.store.hot.put_snapshot(turn.conversation_id, snapshot, turn.version, _HOT_TTL)
        if rows.fingerprints:
            await self.store.hot.put_fingerprints(
                turn.tenant, [(h, turn.conversation_id, n) for h, n in rows.fingerprints[-4:]], _HOT_TTL
            )

    async def _finish(self, turn: Turn) -> None:
        """After the answer: feed usage back into the state and store the turn."""
        state = turn.state
        usage = turn.usage
        record = turn.record
        hidden: list[dict[str, Any]] = []
        recalled: list[str] = []
        if record is not None:
            usage = record.first_usage
            try:
                if record.hidden and turn.last_index >= 0:
                    hidden = record.hidden
                    state = add_hidden(state, turn.last_index, hidden, self.counter)
                if record.pages_recalled:
                    recalled = list(dict.fromkeys(record.pages_recalled))
                    state = record_recall(state, recalled)
            except Exception:
                log.exception("could not record the recall exchange")
                self.metrics.engine_errors.labels("recall").inc()
        if usage is not None:
            prompt = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            if isinstance(prompt, int) and prompt > 0:
                try:
                    state = observe_usage(state, prompt, cached if isinstance(cached, int) else None,
                                          turn.plan.estimated_tokens, time.time())
                except Exception:
                    log.exception("usage feedback failed")
                    self.metrics.engine_errors.labels("feedback").inc()
        try:
            await self._save(turn, state, hidden, recalled)
            if turn.plan.archived and self.services.memory is not None:
                await self.services.memory.notify(turn.tenant, turn.conversation_id)
        except StaleState:
            await self._save_over_newer(turn)
        except Exception as exc:
            # The hot copy keeps the last stored state: the client resends these messages with its next request,
            # whose plan starts from that state and stores them then.
            log.warning("could not store the turn of %s (%s); the next turn stores its messages",
                        turn.conversation_id, exc)
            self.metrics.store_write_failures.labels("finish").inc()

    async def _save_over_newer(self, turn: Turn) -> None:
        """Another writer stored a newer state meanwhile: plan this turn's messages again on top of it."""
        log.warning("conversation %s: a newer state was stored meanwhile; planning the turn again on top of it",
                    turn.conversation_id)
        self.metrics.engine_errors.labels("stale_state").inc()
        try:
            stored = await self.store.repo.load_snapshot(turn.tenant, turn.conversation_id)
            if stored is None or stored[0] is None:
                return
            newer = ConversationState.from_bytes(stored[0])
            turn.plan = plan(newer, turn.extra["input"], turn.extra["config"], self.counter)
            await self._intake_images(turn.plan)
            turn.version = stored[1]
            await self._save(turn, turn.plan.state)
        except Exception:
            log.exception("could not store the turn of %s over the newer state", turn.conversation_id)
            self.metrics.store_write_failures.labels("stale").inc()

    # ------------------------------------------------------------------------------------------------
    async def _unchanged(self, request: Request, body: bytes, started: float, stream: bool) -> Response:
        return await forward(
            self.services, "chat", "POST", "/chat/completions", request.url.query, request.headers, body, started,
            expect_stream=stream,
        )

    async def _fallback(
        self, request: Request, data: dict[str, Any], body: bytes, started: float, stream: bool,
        system: list[dict[str, Any]], messages: list[dict[str, Any]],
    ) -> Response:
        """Without context management: the request unchanged, or trimmed to the prompt budget when it would not
        fit (nothing is archived; the client keeps every message and resends it)."""
        try:
            window = await self.window.tokens()
            max_tokens = data.get("max_completion_tokens") or data.get("max_tokens")
            budget = self._engine_config(window).budget(
                max_tokens if isinstance(max_tokens, int) else None)
            budget = int(budget / (1.03 * self.fallback_ratio))  # in the upstream's tokens, with a 3% margin
            tools = data.get("tools")
            fixed = self.counter.count_text(_encode(tools).decode()) if tools else 0
            trimmed = trim_to_budget(system, messages, budget, self.counter, fixed)
        except Exception:
            log.exception("could not trim the request; forwarding it unchanged")
            trimmed = None
        if trimmed is not None:
            self.metrics.trimmed_requests.inc()
            body = _encode({**data, "messages": trimmed})
        return await self._unchanged(request, body, started, stream)

    def _count_plan(self, p: Plan) -> None:
        m = self.metrics
        m.estimated_prompt_tokens.inc(p.estimated_tokens)
        m.prefix_reuse_tokens.inc(getattr(p, "stable_prefix_tokens", 0) or 0)
        saved = getattr(p, "tokens_saved", 0) or 0
        if saved > 0:
            m.tokens_saved.inc(saved)
        if p.epoch:
            m.epochs.labels(p.epoch_reason or "unknown").inc()
        if p.archived:
            m.pages_archived.inc(len(p.archived))
        for _, rule in p.evicted:
            m.evictions.labels(rule).inc()
        if p.over_budget:
            m.over_budget.inc()

    def _response_headers(self, turn: Turn) -> dict[str, str]:
        active, archived = page_counts(turn.state)
        return {
            "X-Memci-Conversation-Id": turn.conversation_id,
            "X-Memci-Pages-Active": str(active),
            "X-Memci-Pages-Archived": str(archived),
            "X-Memci-Epoch": "true" if turn.plan.epoch else "false",
        }

    def _remember_prompt(self, conversation_id: str, p: Plan) -> None:
        self.last_prompts[conversation_id] = LastPrompt(p.messages, list(p.blocks), p.epoch, time.time())
        self.last_prompts.move_to_end(conversation_id)
        while len(self.last_prompts) > 1000:
            self.last_prompts.popitem(last=False)


def page_counts(state: ConversationState) -> tuple[int, int]:
    active = archived = 0
    for page in state.pages:
        if page.status == 0:
            active += 1
        else:
            archived += 1
    return active, archived


async def start_context(services: Services) -> None:
    """Open the store (embedded defaults when nothing is configured) and enable context management."""
    from proxy.store.factory import open_store

    services.store = await open_store(services.settings)
    services.notes["database"] = services.store.kind_db
    services.notes["hot_state"] = services.store.kind_hot
    services.context = ContextService(services)
    hot = services.store.hot
    if hasattr(hot, "degraded"):
        services.metrics.hot_state_degraded.set_function(lambda: 1.0 if hot.degraded else 0.0)
    log.info(
        "context management on: database %s, hot state %s, upstream %s",
        services.store.kind_db, services.store.kind_hot, services.settings.upstream_url,
    )
