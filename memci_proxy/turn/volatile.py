"""The per-turn volatile blocks next to the latest user message: the standalone intent (B2b) and retrieved
memory (B5). Both are optional per deployment (settings) and per request (headers X-Memci-Rewrite, X-Memci-Memory).
The rewrite runs only when something uses it: the intent goes into the prompt, or memory is retrieved with it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from memci_proxy.engine import ConversationState
from memci_proxy.engine.intent import RewriteResult, intent_block, message_text
from memci_proxy.metrics import Metrics
from memci_proxy.recall.push.memory_block import format_memory
from memci_proxy.recall.push.proactive import missing_terms
from memci_proxy.recall.resolver import RecallContext, RecallResolver
from memci_proxy.rewrite.levels import rewrite
from memci_proxy.rewrite.model import ModelRewriter
from memci_proxy.settings import Settings

log = logging.getLogger("memci.context")
HISTORY_FOR_REWRITE = 12


@dataclass
class Volatile:
    intent: str = ""
    memory: str = ""
    rewrite: RewriteResult | None = None


def injection_on(settings: Settings, memory_mode: str) -> bool:
    """B5 for this request: X-Memci-Memory on/off, else memory_push=injection (or memory_injection_enabled)."""
    if memory_mode in ("on", "off"):
        return memory_mode == "on"
    return settings.memory_push == "injection" or settings.memory_injection_enabled


def push_on(settings: Settings, memory_mode: str) -> bool:
    """The proactive recall round for this request: memory_push=proactive, unless B5 or the header says otherwise."""
    return settings.memory_push == "proactive" and not injection_on(settings, memory_mode) and memory_mode != "off"


class VolatileContext:
    def __init__(self, settings: Settings, metrics: Metrics, resolver: RecallResolver, session: Any = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.resolver = resolver
        self.model: ModelRewriter | None = None
        if settings.rewrite_model_url:
            self.model = ModelRewriter(
                settings.rewrite_model_url.rstrip("/"), settings.rewrite_model or "default",
                timeout_s=settings.rewrite_timeout_ms / 1000, api_key=settings.rewrite_model_api_key, session=session,
            )

    async def close(self) -> None:
        if self.model is not None:
            await self.model.aclose()

    async def rewrite(self, messages: list[dict[str, Any]], mode: str = "") -> RewriteResult | None:
        """The standalone query of the latest message when it is the user's; None when rewriting is off."""
        if not messages or messages[-1].get("role") != "user":
            return None
        mode = mode or ("model" if self.settings.intent_rewrite_enabled else "off")
        if mode == "off":
            return None
        history = messages[:-1][-HISTORY_FOR_REWRITE:]
        last_user = message_text(messages[-1])
        model = self.model if mode == "model" else None
        started = time.perf_counter()
        result = await rewrite(history, last_user, model, self.settings.rewrite_timeout_ms / 1000)
        self.metrics.intent_rewrite_seconds.observe(time.perf_counter() - started)
        self.metrics.intent_rewrites.labels(result.level, result.reason or "").inc()
        return result

    async def blocks(
        self, rewrite_mode: str, memory_mode: str, tenant: str, conversation_id: str,
        state: ConversationState | None, messages: list[dict[str, Any]],
    ) -> Volatile:
        """``rewrite_mode`` / ``memory_mode``: the request's X-Memci-Rewrite / X-Memci-Memory ("" when absent)."""
        out = Volatile()
        memory_on = injection_on(self.settings, memory_mode)
        memory_possible = (memory_on and state is not None and state.first_active_page > 0 and bool(messages)
                           and messages[-1].get("role") == "user")
        placement = "always" if rewrite_mode in ("rules", "model") else self.settings.intent_in_prompt
        if rewrite_mode != "off" and (placement == "always" or memory_possible):
            try:
                out.rewrite = await self.rewrite(messages, rewrite_mode)
            except Exception:
                log.exception("intent rewrite failed")
                self.metrics.engine_errors.labels("rewrite").inc()
        if memory_possible:
            try:
                out.memory = await self._memory(tenant, conversation_id, state, messages, out.rewrite)
            except Exception:
                log.exception("memory retrieval failed")
                self.metrics.engine_errors.labels("memory").inc()
        if out.memory:
            self.metrics.memory_injections.inc()
        if out.rewrite is not None and out.rewrite.changed and (
            placement == "always" or (placement == "with_memory" and out.memory)
        ):
            out.intent = intent_block(out.rewrite.query)
        return out

    async def _memory(
        self, tenant: str, conversation_id: str, state: ConversationState, messages: list[dict[str, Any]],
        rewritten: RewriteResult | None,
    ) -> str:
        s = self.settings
        if s.memory_max_hits == 0 or s.memory_budget_tokens == 0:
            return ""
        if state.first_active_page == 0:
            return ""  # nothing archived: everything is in the prompt already
        query = rewritten.query if rewritten is not None else message_text(messages[-1])
        missing = self._missing_keywords(query, state, messages)
        if not missing:
            return ""  # the prompt already holds every word the user asks about: nothing worth a cache miss
        ctx = RecallContext(tenant, conversation_id, state, messages)
        # lexical only: memory injection runs before every upstream call and must not wait on an embeddings call
        hits = await self.resolver.search(ctx, " ".join(missing), s.memory_max_hits, use_vectors=False)
        if not hits:
            return ""
        found = [(f"page {label}", text) for label, _score, _record, text in await self.resolver.hit_pages(ctx, hits)]
        return format_memory(found, budget_tokens=s.memory_budget_tokens, max_hits=s.memory_max_hits,
                             cut_chars=s.memory_cut_chars)

    @staticmethod
    def _missing_keywords(query: str, state: ConversationState, messages: list[dict[str, Any]]) -> list[str]:
        """Keywords of the query (seed 001: top 6, stop words removed) that the active pages never mention.

        Memory is injected for these only: a block next to the latest message costs a cache miss on the next
        turn, worth paying when the archive knows something the prompt does not.
        """
        first_active = next((p.start for p in state.pages if p.status == 0), len(messages) - 1)
        return missing_terms(query, (message_text(m) for m in messages[first_active:-1]))
