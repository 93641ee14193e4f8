"""One managed chat turn, end to end (DESIGN.md section 3), with no HTTP in it.

identity -> session lock -> state (this process's, the hot copy, else PostgreSQL) -> engine.plan -> what leaves
the prompt stored first -> the upstream exchange (recall rounds kept as they finish: memci_proxy.turn.keeping) ->
after the answer (memci_proxy.turn.ending): usage feedback, the turn queued for PostgreSQL, the hot copy updated, the
lock released.
Any failure of the engine or the store before the upstream call sends the client's request unchanged (trimmed to
the budget when it would not fit).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from typing import Any

import msgspec

from memci_proxy.blobs import make_blob_store
from memci_proxy.engine import (
    ConversationState, EngineConfig, Plan, TurnInput, add_hidden, plan, record_recall,
)
from memci_proxy.engine.learner import LearnedCounter
from memci_proxy.metrics import Metrics
from memci_proxy.recall.tool.loop import prepare_rounds
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.recall.tool.schema import recall_tool
from memci_proxy.recall.vectors.build import build_page_vectors
from memci_proxy.settings import Settings
from memci_proxy.store.ports import LockTimeout, SnapshotBase, StaleState
from memci_proxy.turn.cache_keys import upstream_headers, with_prompt_cache_key
from memci_proxy.turn.call import ChatCall
from memci_proxy.turn.fallback import unmanaged_body
from memci_proxy.turn.identity import continues, new_conversation_id, split_system
from memci_proxy.turn.lookup import ConversationLookup, Found
from memci_proxy.turn.prompts import LastPrompts
from memci_proxy.turn.recall_rounds import ResultsByModel, TurnRecall, recall_room
from memci_proxy.turn.rows import RowSet, hidden_rows, page_rows, turn_rows
from memci_proxy.turn.states import LOCK_LEASE_S, LOCK_WAIT_S, ConversationStates, Known, StoreUnavailable
from memci_proxy.turn.turn import Redo, Release, Turn
from memci_proxy.turn.across import UserMemory
from memci_proxy.turn.answer_room import answer_limit, estimate_scale, fit_answer, fixed_part, requested_tokens, too_long
from memci_proxy.turn.push import QUESTION_HIGH_WATERMARK, ProactivePush, with_push_room
from memci_proxy.turn.volatile import VolatileContext, push_on
from memci_proxy.turn.shapes import Shape, ShapeChoice, holds_rounds, renderer, resend
from memci_proxy.turn.stages import StageClock
from memci_proxy.turn.window import ContextWindow
from memci_proxy.turn.ending import TurnEnding
from memci_proxy.turn.epoch_memory import epoch_memory, jobs_first, waited
from memci_proxy.turn.keeping import RoundKeeping
from memci_proxy.upstream.refusal import REFUSAL_STATUSES, context_refusal
from memci_proxy.upstream.cache_kind import CacheKind
from memci_proxy.upstream.exchange import Answer, Exchange, Outgoing
from memci_proxy.turn.memos import register_process_memos
from memci_proxy.turn.counting import TurnCounts
from memci_proxy.turn.plan_metrics import count_plan
from memci_proxy.vision import intake_images, make_describer
from memci_proxy.turn.page_counts import page_headers
from memci_proxy.wire.errors import ProxyError

log = logging.getLogger("memci.turn")
_encode = msgspec.json.Encoder().encode
NOTHING_STORED = Known(None, 0, SnapshotBase(0, None))


class TurnService:
    def __init__(self, settings: Settings, metrics: Metrics, exchange: Exchange, store: Any, memory: Any = None) -> None:
        self.settings = s = settings
        self.metrics = metrics
        self.exchange = exchange
        self.store = store
        self.counts = TurnCounts(settings, exchange.client, metrics)  # base counts; per conversation, learned ones
        self.counter = self.counts.base
        register_process_memos()  # the engine's and the search's memos, in memci_cache_*
        self.window = ContextWindow(settings, exchange.client)
        self.cache_kind = CacheKind(s.upstream_cache, exchange.client)  # when the memory jobs run
        self.shapes = ShapeChoice()  # per upstream: the shape of the recall rounds it accepts (memci_proxy.turn.shapes)
        vectors = build_page_vectors(store.repo, s.embeddings_url, s.upstream_url, s.embeddings_model,
                                     s.embeddings_api_key, s.embeddings_timeout, local_model=s.embeddings_local,
                                     local_weights=s.embeddings_local_weights, metrics=metrics,
                                     cache_max_bytes=s.embeddings_cache_mb * 2**20,
                                     max_lag_s=s.embeddings_max_lag_s, pages=s.embeddings_pages,
                                     query_deadline_s=s.embeddings_query_deadline_ms / 1000,
                                     page_process=s.embeddings_page_process)
        self.resolver = RecallResolver(
            store.repo, self.counter, s.recall_max_tokens, vectors=vectors, metrics=metrics,
            lexical_weight=s.recall_lexical_weight, vector_weight=s.recall_vector_weight, min_cosine=s.recall_min_cosine,
            index_max_bytes=s.search_index_max_mb * 2**20, entity_boost=s.recall_entity_boost,
            user_weight=s.recall_user_weight,
        )
        self.recall_enabled = s.recall_enabled
        self.volatile = VolatileContext(settings, metrics, self.resolver, getattr(exchange.client, "session", None))
        self.push = ProactivePush(metrics, self.resolver)
        self.result_densities = ResultsByModel()  # recall results' upstream counts per counted token, lately
        self.across = UserMemory(store.repo, metrics, s.user_memory and s.recall_enabled,
                                 s.user_memory_timeout_ms / 1000)
        self.states = ConversationStates(store.repo, store.hot, store.kind_hot == "redis", metrics, settings, self._redo)
        self.lookup = ConversationLookup(store.hot, store.repo, self.states.state_of, s.state_cache_max_entries, metrics)
        self.last_prompts = LastPrompts(s.last_prompts_max_entries, s.last_prompts_max_mb << 20)
        self.blobs = make_blob_store(settings)
        owners = getattr(store, "owners", None)  # tenant walls for images (memci_proxy.store.sql.blob_queries)
        self.describer = make_describer(settings, self.blobs, owns=owners.owns_blob if owners else None,
                                        on_refused=lambda why: metrics.vision_urls_refused.labels(why).inc())
        self._configs: dict[int, EngineConfig] = {}
        self.keeping = RoundKeeping(self.states, self.counter, metrics)  # the recall exchanges, stored as they finish
        self.ending = TurnEnding(settings, metrics, self.counts, self.states, self.across, self.resolver, self.keeping,
                                 self.recall_enabled)  # the after-answer step
        self.memory = memory
        self.fallback_ratio = 1.0  # the upstream's tokens per estimated token, as the last plan learned it

    @property
    def memory(self) -> Any:
        """memci_proxy.workers.runner.MemoryWorker when the memory workers run (set once they start)."""
        return self.ending.memory

    @memory.setter
    def memory(self, worker: Any) -> None:
        self.ending.memory = worker

    def start(self) -> None:
        self.states.start()
        warm = getattr(self.resolver.vectors.embedder, "warm", None) if self.resolver.vectors else None
        if warm is not None and self.recall_enabled:
            warm()  # the packaged model loads in a worker thread

    def embeddings_status(self) -> dict[str, object] | None:
        """The packaged embedding model's state for /ready (None: an embeddings server, or no vector search)."""
        status = getattr(self.resolver.vectors.embedder, "status", None) if self.resolver.vectors else None
        return status() if status is not None and self.recall_enabled else None

    async def close(self) -> None:
        """Finish the turns still running their after-answer step, write everything queued, close clients."""
        await self.ending.finished()
        await self.across.close()
        await self.ending.close()
        await self.states.close()
        await self.volatile.close()
        await self.resolver.close()
        await self.describer.close()
        await self.blobs.close()
        await self.counts.close()

    def _config(self, window: int) -> EngineConfig:
        config = self._configs.get(window)
        if config is None:
            config = self._configs[window] = EngineConfig.from_settings(self.settings, window)
        return config

    # ------------------------------------------------------------------------------------------------------------
    async def handle(self, call: ChatCall) -> Answer:
        if self.resolver.vectors is not None:
            self.resolver.vectors.mark_busy()  # background page embedding waits for a quiet moment
        stages = StageClock()
        began = time.perf_counter()
        if call.started:
            stages.add("edge", call.started, began)
        system, messages = split_system(call.messages)
        try:
            found = await self.lookup.find(call, messages)
        except Exception:
            log.exception("conversation lookup failed; forwarding without context management")
            self.metrics.engine_errors.labels("identify").inc()
            return await self._fallback(call, system, messages)
        lock = self.store.hot.lock(found.conversation_id, LOCK_WAIT_S, LOCK_LEASE_S)
        waiting = stages.add("lookup", began)
        try:
            await lock.__aenter__()
        except LockTimeout:
            self.metrics.lock_wait.observe(time.perf_counter() - waiting)
            self.metrics.lock_timeouts.inc()
            raise ProxyError(409, "another request of this conversation is still running", "conflict_error",
                             "session_locked", headers={"Retry-After": "1"}) from None
        except Exception:
            log.exception("session lock failed; forwarding without context management")
            self.metrics.engine_errors.labels("lock").inc()
            return await self._fallback(call, system, messages)
        self.metrics.lock_wait.observe(stages.add("lock", waiting) - waiting)
        release = Release(lock)
        try:
            turn = await self._plan(call, found, system, messages, stages)
        except BaseException as exc:
            await release()
            if not isinstance(exc, Exception) or isinstance(exc, ProxyError):
                raise
            if isinstance(exc, StoreUnavailable):  # nothing may leave the prompt unstored: a trimmed request
                self.metrics.store_write_failures.labels("plan").inc()
            else:
                log.exception("planning failed; forwarding unchanged")
                self.metrics.engine_errors.labels("plan").inc()
            return await self._fallback(call, system, messages)
        try:
            answer = await self._exchange(turn)
            if answer.events is None and answer.status in REFUSAL_STATUSES:
                refusal = context_refusal(answer.status, answer.body)
                window = await self.window.refused(refusal.window, turn.window) if refusal.too_long else None
                scale = estimate_scale(turn, refusal) if refusal.too_long and window is None else None
                if window is not None or scale is not None:
                    # the upstream's window shrank, or the prompt's estimate fell short of the upstream's count of it:
                    # plan the turn again (for the new window), send it once more (max_tokens fitted to that count)
                    self.metrics.turn_resends.labels("window" if window is not None else "estimate").inc()
                    await self.keeping.kept(turn)  # the pushed round's write lands before the turn is planned again
                    again = Found(turn.conversation_id, "prefix" if turn.how in ("new", "fork") else turn.how,
                                  found.known_prefix, found.chains)
                    turn = await self._plan(call, again, system, messages, turn.stages, retry=True)
                    turn.estimate_scale = scale or 1.0
                    answer = await self._exchange(turn)
        except BaseException as exc:
            await self.ending.finish(turn, release)
            if isinstance(exc, (ProxyError, asyncio.CancelledError)) or not isinstance(exc, Exception):
                raise
            log.exception("the upstream exchange failed")
            self.metrics.engine_errors.labels("recall").inc()
            raise ProxyError(502, f"the upstream's answer could not be read: {type(exc).__name__}",
                             "upstream_error", "upstream_malformed") from None
        return await self.ending.after_answer(answer, turn, release)

    # ------------------------------------------------------------------------------------------------------------
    async def _plan(self, call: ChatCall, found: Found, system: list[dict[str, Any]], messages: list[dict[str, Any]],
                    stages: StageClock, retry: bool = False) -> Turn:
        """Plan, and store what leaves the prompt before the upstream sees it (an epoch). A conversation's first
        turn is stored now too, so that its identity (the prefix fingerprints) survives a crash. Another state stored
        meanwhile (StaleState) plans once more from the stored state; a store that fails is StoreUnavailable."""
        for attempt in (0, 1):
            turn = await self._plan_once(call, found, system, messages, stages, fresh=attempt > 0,
                                         counted=attempt > 0 or retry)
            # an output offloaded on arrival is a page that leaves the prompt: stored before the upstream sees it
            if not turn.plan.epoch and not turn.plan.offloaded and turn.known.state is not None:
                return turn
            storing = time.perf_counter()
            try:
                turn.known = await self.states.save_now(call.tenant, turn.conversation_id, turn.known, turn.state,
                                                        turn.rows, index_behind=True)
                turn.rows = RowSet()
                stages.add("store", storing)
                return turn
            except StaleState:
                if attempt:
                    raise StoreUnavailable("the stored state kept changing") from None
                log.warning("conversation %s: another state was stored meanwhile; planning again from it",
                            turn.conversation_id)
                self.metrics.engine_errors.labels("stale_state").inc()
            except Exception as exc:
                log.warning("could not store archived pages (%s): no archiving this turn", exc)
                raise StoreUnavailable(str(exc)) from exc
        raise AssertionError("unreachable")

    async def _plan_once(self, call: ChatCall, found: Found, system: list[dict[str, Any]],
                         messages: list[dict[str, Any]], stages: StageClock, fresh: bool,
                         counted: bool = False) -> Turn:
        began = time.perf_counter()
        tenant, repo = call.tenant, self.store.repo
        conversation_id, how, known_prefix = found.conversation_id, found.how, found.known_prefix
        known, parent_id = NOTHING_STORED, None
        if how != "new":
            known = await self.states.load(tenant, conversation_id, fresh)
            state = known.state
            if how == "prefix" and state is not None and known_prefix < state.entry_count and not continues(
                    state, messages, call.raw_messages):
                # An edit or a regeneration: continue in a fork, leaving the original untouched.
                parent_id, conversation_id, how, known = conversation_id, new_conversation_id(), "fork", NOTHING_STORED
        try:
            if how == "fork":
                await self.states.writer.settle(parent_id)  # the fork copies the parent's stored messages
                await repo.create_conversation(tenant, conversation_id, parent_id=parent_id, forked_at=known_prefix,
                                               end_user=call.end_user)
            elif known.state is None:
                await repo.create_conversation(tenant, conversation_id, parent_id=None, forked_at=None,
                                               session_key=conversation_id if how == "session_key" else None,
                                               end_user=call.end_user)
                if self.memory is not None:
                    self.memory.created(tenant, conversation_id)
        except Exception as exc:
            log.warning("could not create conversation %s in the database: %s", conversation_id, exc)
            raise StoreUnavailable(str(exc)) from exc
        if not counted:
            self.metrics.child(self.metrics.conversations, how).inc()
        state = known.state
        window = await self.window.tokens()
        config = self._config(window)
        pushing = self.recall_enabled and push_on(self.settings, call.memory_mode)
        weighing = stages.add("plan", began)
        need = await self.push.weigh(tenant, conversation_id, state, messages) if pushing else None
        if need is not None and need.room_wanted:
            config = with_push_room(config, need.room_ceiling)  # its round needs room: an epoch now, not no round
        across = (await self.across.weigh(tenant, call.end_user, conversation_id, state, messages)
                  if pushing and call.end_user and not (need and need.wanted) else None)
        if across is not None:  # the user's other conversations answer it: its round needs room
            config = with_push_room(config, QUESTION_HIGH_WATERMARK)
        planning = stages.add("weigh", weighing)
        data = call.data
        tools = list(data.get("tools") or [])
        if self.recall_enabled:
            tools.append(recall_tool(self.settings.recall_tool_name))  # what the upstream will get
        max_tokens = requested_tokens(data)
        volatile = await self.volatile.blocks(call.rewrite_mode, call.memory_mode, tenant, conversation_id, state,
                                              messages)
        memory = await epoch_memory(self.memory, tenant, conversation_id, state, call.end_user)
        model = data.get("model") if isinstance(data.get("model"), str) else ""
        counter = await self.counts.counter_for(model, system, messages, known_prefix, state)
        tools_json = _encode(tools).decode() if tools else ""
        turn_input = TurnInput(
            summary=memory.summary, profile=memory.profile,
            intent=volatile.intent, memory=volatile.memory, system=system, messages=messages,
            tools_tokens=self.counts.tools_tokens(counter, tools_json),
            max_tokens=max_tokens, now=time.time(),
            raw_messages=call.raw_messages, image_descriptions=self.describer.for_tenant(tenant),  # its own only
            offload=call.offload_mode != "off",
        )
        result = plan(state, turn_input, config, counter)
        if memory.behind and result.epoch_due:  # the previous epoch's jobs are late: this epoch waits for them
            caught_up = await waited(self.memory, tenant, conversation_id, memory, call.end_user)
            if caught_up is not None:
                turn_input = dataclasses.replace(turn_input, summary=caught_up.summary, profile=caught_up.profile)
                result = plan(state, turn_input, config, counter)
        if result.over_budget and not config.fits(result.estimated_tokens, max_tokens):
            # not even the fixed part and a small answer fit: refused, nothing stored, nothing counted but this
            self.metrics.over_budget.inc()
            refusal = too_long(result, config, max_tokens, fixed_part(result, turn_input.tools_tokens))
            log.warning("conversation %s: refused (400): %s", conversation_id, refusal.message)
            raise refusal
        await self._intake_images(result, tenant, conversation_id)
        self.fallback_ratio = max(1.0, float(result.state.correction_ratio or 1.0))
        accounting = count_plan(self.metrics, result, state)
        fingerprints = self.lookup.fingerprints(Found(conversation_id, how, known_prefix, found.chains), conversation_id,
                                                known.state, result, messages, call.end_user)
        self.lookup.remember(tenant, call.end_user, messages, conversation_id)
        redo = Redo(turn_input, config, fingerprints, len(messages) - 1, counter=counter)
        rows = turn_rows(tenant, conversation_id, result, result.state, fingerprints, state)
        stages.add("plan", planning)
        return Turn(call, conversation_id, how, known, result, result.state, rows, redo, model=model,
                    tools_json=tools_json, learned=isinstance(counter, LearnedCounter), accounting=accounting,
                    need=need, across=across, window=window, stages=stages)

    async def _intake_images(self, result: Plan, tenant: str, conversation_id: str) -> None:
        """New messages' data: images to the blob store (once per hash), descriptions started; the entries
        rows keep blob references instead of the bytes."""
        if not any(isinstance(m.get("content"), list) for _, m, _, _ in result.new_entries):
            return
        stored = await intake_images([m for _, m, _, _ in result.new_entries], self.blobs, self.describer,
                                     tenant, conversation_id, getattr(self.store, "owners", None))
        result.new_entries = [(i, s, d, t) for (i, _, d, t), s in zip(result.new_entries, stored)]

    # ------------------------------------------------------------------------------------------------------------
    async def _exchange(self, turn: Turn) -> Answer:
        call, s = turn.call, self.settings
        headers = {
            "X-Memci-Conversation-Id": turn.conversation_id,
            **page_headers(turn.conversation_id, turn.state),
            "X-Memci-Epoch": "true" if turn.plan.epoch else "false",
        }
        out = Outgoing("chat", "POST", "/chat/completions", call.query, call.headers, None, call.started, call.stream,
                       route_key=turn.conversation_id, extra_headers=headers,
                       upstream_headers=upstream_headers(s, turn.conversation_id), internal_text=True)
        data = with_prompt_cache_key(call.data, turn.conversation_id, s.prompt_cache_key)
        if not self.recall_enabled:
            sent = fit_answer(turn, headers, {**data, "messages": turn.plan.messages}, 0, self.metrics)
            out.body = _encode(sent)
            self.last_prompts.remember(turn, sent, len(out.body), self.memory, self._routed)
            await jobs_first(self.memory, self.cache_kind, turn, self.settings.summary_timeout_s)

            def on_usage(usage: dict[str, Any]) -> None:
                turn.usage = usage

            sending = time.perf_counter()
            answer = await self.exchange.send(out, on_usage)
            turn.stages.add("upstream", sending)
            return answer
        body, loop_config = prepare_rounds(data, turn.plan.messages, s.recall_tool_name, s.recall_max_rounds,
                                           call.stream)
        room = recall_room(turn.plan, turn.state, s.safety_margin * await self.window.tokens(),
                           self.counts.text_unit(turn.redo.counter))
        context = RecallContext(call.tenant, turn.conversation_id, turn.state, turn.redo.input.messages,
                                turn.redo.input.image_descriptions, call.end_user if self.across.enabled else "")

        async def keep(exchange: list[dict[str, Any]]) -> None:
            # a whole answer's next round carries it: stored alongside (a stream relays the rounds' events as they come)
            await self.keeping.keep(turn, exchange, alongside=not call.stream)

        rounds = TurnRecall(loop_config, context, self.resolver, self.metrics, room, call.data.get("n") or 1, keep,
                            self.result_densities.of(turn.model), turn.stages)
        turn.record = rounds.record
        pushed: list[dict[str, Any]] = []
        if push_on(s, call.memory_mode):
            # The proxy's own recall round, kept (durably) before the request that carries it goes upstream.
            pushing = time.perf_counter()
            pushed = (await self.push.exchange(turn, rounds, loop_config.recall_name)
                      or self.across.exchange(turn, rounds, loop_config.recall_name))
            if pushed:
                await self.keeping.keep(turn, pushed, alongside=True)
                body["messages"] = [*body["messages"], *pushed]
                turn.pushed_tokens = sum((turn.redo.counter or self.counter).count_message(m) for m in pushed)
            if pushed or turn.across is not None or (turn.need is not None and turn.need.wanted):
                turn.stages.add("push", pushing)  # (a round searched for, pushed or not)
        pushed_tokens = math.ceil(turn.pushed_tokens * max(1.0, turn.state.correction_ratio))
        body = fit_answer(turn, headers, body, pushed_tokens, self.metrics)
        loop_config.answer_limit = answer_limit(turn, rounds, self.counts.text_unit(turn.redo.counter))
        name = loop_config.recall_name
        upstream = self.exchange.client.url(out.path, out.query, out.route_key)
        shape = self.shapes.renderer(upstream, name)
        sent = shape(body) if shape is not None else body
        out.body = _encode(sent)
        self.last_prompts.remember(turn, sent, len(out.body), self.memory, self._routed, pushed)
        await jobs_first(self.memory, self.cache_kind, turn, self.settings.summary_timeout_s)
        sending, recalled = time.perf_counter(), turn.stages.of("recall")
        answer = await self.exchange.send_with_recall(out, sent, rounds, shape)
        if (answer.events is None and answer.status in REFUSAL_STATUSES and holds_rounds(sent["messages"], name)
                and not context_refusal(answer.status, answer.body).too_long):
            answer = await self._reshaped(turn, out, body, rounds, upstream, name, answer)
        turn.stages.add("upstream", sending, besides=turn.stages.of("recall") - recalled)
        return answer

    async def _reshaped(self, turn: Turn, out: Outgoing, body: dict[str, Any], rounds: TurnRecall, upstream: str,
                        name: str, refused: Answer) -> Answer:
        """The upstream refused a request holding the proxy's recall rounds: the turn again with them in the next
        shape (memci_proxy.turn.shapes) until one is accepted, which is remembered for that upstream."""
        async def send(sent: dict[str, Any], apply: Shape) -> Answer:
            out.body = _encode(sent)
            return await self.exchange.send_with_recall(out, sent, rounds, apply)

        answer, shape = await resend(send, body, self.shapes.shape(upstream), name, REFUSAL_STATUSES)
        if shape is not None:
            self.shapes.choose(upstream, shape, refused.status)
            self.metrics.turn_resends.labels("rounds").inc()
            last = self.last_prompts.get(turn.conversation_id)
            if last is not None:
                last.body = renderer(shape, name)(body)  # as sent: a memory job resends it
        return answer or refused

    async def _redo(self, tenant: str, conversation_id: str, stored: ConversationState | None, redo: Redo
                    ) -> tuple[ConversationState, RowSet]:
        """The turn planned again on another stored state: every message past that state is new to it."""
        result = plan(stored, redo.input, redo.config, redo.counter or self.counter)
        await self._intake_images(result, tenant, conversation_id)
        state = result.state
        rows = turn_rows(tenant, conversation_id, result, state, redo.fingerprints, stored)
        if redo.hidden and 0 <= redo.last_index < state.entry_count:
            state = add_hidden(state, redo.last_index, redo.hidden, redo.counter or self.counter)
            rows.hidden.update(hidden_rows(redo.last_index, 0, redo.hidden))
        if redo.recalled:
            state = record_recall(state, redo.recalled)
            rows.pages.update(page_rows(state, redo.recalled))
        return state, rows

    # ------------------------------------------------------------------------------------------------------------
    async def _fallback(self, call: ChatCall, system: list[dict[str, Any]], messages: list[dict[str, Any]]) -> Answer:
        """Without context management: the request unchanged, or trimmed to the prompt budget when it would not
        fit (nothing is archived; the client keeps every message and resends it)."""
        config = self._config(await self.window.tokens())
        body = unmanaged_body(call.data, call.body, system, messages, config, self.counter, self.fallback_ratio)
        if body is not call.body:
            self.metrics.trimmed_requests.inc()
        return await self.exchange.send(Outgoing("chat", "POST", "/chat/completions", call.query, call.headers, body,
                                                 call.started, call.stream, internal_text=True))

    def _routed(self, conversation_id: str) -> str:
        """The upstream worker a conversation's requests go to (whose cache holds its prompt); "" with one."""
        routed = getattr(self.exchange.client, "base_url", None)
        return routed(conversation_id) if callable(routed) else ""

    def state_of(self, conversation_id: str) -> ConversationState | None:
        """This process's newest state of a conversation (admin views)."""
        return self.states.state_of(conversation_id)

    async def flush(self, conversation_id: str) -> None:
        """Write this process's queued turns of the conversation now (reads of the database that follow see them)."""
        await self.ending.finished()  # turns answered a moment ago, not queued yet
        await self.states.writer.flush(conversation_id)
        await self.states.index.wait(conversation_id)

    async def forget(self, conversation_id: str) -> None:
        """A deleted conversation leaves the per-process caches and the write queue."""
        self.last_prompts.pop(conversation_id, None)
        self.lookup.forget(conversation_id)
        await self.states.forget(conversation_id)
        self.resolver.indexes.forget(conversation_id)
        if self.resolver.vectors is not None:
            self.resolver.vectors.forget(conversation_id)


async def start_turn_service(settings: Settings, metrics: Metrics, exchange: Exchange) -> TurnService:
    """Open the store (embedded defaults when nothing is configured) and start the managed turn."""
    from memci_proxy.store.factory import open_store

    store = await open_store(settings)
    service = TurnService(settings, metrics, exchange, store)
    service.start()
    hot = store.hot
    if hasattr(hot, "degraded"):
        metrics.hot_state_degraded.set_function(lambda: 1.0 if hot.degraded else 0.0)
    log.info("context management on: database %s, hot state %s, upstream %s",
             store.kind_db, store.kind_hot, settings.upstream_url)
    return service

