"""Answering a recall call: archived pages by number, or a search over every archived page (evicted too)."""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from memci_proxy.engine import ACTIVE, ConversationState, TokenCounter, page_entry_range, page_hidden_messages
from memci_proxy.engine.output_preview import output_text
from memci_proxy.engine.state import STATUS_NAMES, find_page
from memci_proxy.recall.dates.asked import day_of
from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.lexical.counting import COUNTED
from memci_proxy.recall.reading.hits import (CALL_EXCERPT_TOKENS, EXCERPT_CHARS, MIN_EXCERPT_TOKENS,
                                             WHOLE_HIT_FACTOR, WHOLE_MESSAGE_TOKENS, FoundHit, HitRenderer,
                                             page_or_offload, query_terms)
from memci_proxy.recall.reading.offloads import OffloadRead, offloaded_reads, read_chars, read_lines, search_lines
from memci_proxy.recall.reading.pagetext import (USER_PLACE_WEIGHT, page_messages_with_hidden, render_page, user_text,
                                                 vector_text)
from memci_proxy.recall.search.indexes import PageSource, RecallContext, SearchIndexes
from memci_proxy.recall.search.ranking import (PAGE, USER, archived_view_wanted, best_views, candidate_views, fuse,
                                               lexical_candidates, lexical_ranking, preferred_days, query_weights,
                                               vector_query)
from memci_proxy.recall.tool.schema import RecallArgs
from memci_proxy.recall.users import across
from memci_proxy.recall.users.search import search_user
from memci_proxy.recall.vectors.candidates import CandidateVectors
from memci_proxy.recall.vectors.index import PageVectors, VectorSearchFailed
from memci_proxy.store.ports import ConversationRepository

__all__ = ["CALL_EXCERPT_TOKENS", "EXCERPT_CHARS", "MIN_EXCERPT_TOKENS", "SEARCH_HITS", "WHOLE_HIT_FACTOR",
           "WHOLE_MESSAGE_TOKENS", "RecallContext", "RecallOutcome", "RecallResolver", "allowed_hits",
           "page_or_offload", "query_terms"]

SEARCH_HITS = 5
FUSION_CANDIDATES = 4  # each ranking contributes up to k * this candidates to the fusion


@dataclass
class RecallOutcome:
    text: str
    kind: str  # "pages" | "query" | "pages+query" | "invalid"
    pages: list[str] = field(default_factory=list)  # pages returned in full (recall statistics)
    hits: list[tuple[str, float]] = field(default_factory=list)
    search_seconds: float = 0.0


def _view_key(label: str, view: str) -> str:
    """The key of a page's view among the vector half's candidates (labels hold no space)."""
    return label if view == PAGE else f"{label} {view}"


def _views_wanted(keys: dict[str, tuple[str, str]]) -> Callable[[str, str], bool]:
    """``wanted(key, text)`` of the vector half: whether that view of a page is embedded at all
    (memci_proxy.recall.search.ranking.archived_view_wanted), the same for a page just archived and a search's
    candidate."""
    two_views = {label for label, view in keys.values() if view == USER}

    def wanted(key: str, text: str) -> bool:
        label, view = keys[key]
        return archived_view_wanted(view, label in two_views, len(text))

    return wanted


def allowed_hits(hits: list[tuple[str, float]], shown_if: Callable[[str], bool]) -> list[tuple[str, float]]:
    """The best hit, then those below it that ``shown_if(label)`` allows, in their order."""
    return [hits[0], *(hit for hit in hits[1:] if shown_if(hit[0]))] if hits else []


class RecallResolver:
    def __init__(
        self,
        repo: ConversationRepository,
        counter: TokenCounter,
        max_tokens: int,
        vectors: PageVectors | CandidateVectors | None = None,
        metrics: Any = None,
        lexical_weight: float = 1.0,
        vector_weight: float = 1.0,
        min_cosine: float | None = None,
        index_max_bytes: int = 128 * 2**20,
        entity_boost: float = 1.0,
        clock: Callable[[], float] = time.time,
        user_weight: int = 1,
    ) -> None:
        """``vectors``: the vector half of the search (None: lexical only). ``metrics``: a memci_proxy.metrics.Metrics
        (``recall_fallbacks`` counts searches that went lexical only). The weights and ``min_cosine`` tune the
        fusion (memci_proxy.recall.search.fusion.fuse_lexical_and_vector). ``index_max_bytes``: bound of this process's
        search indexes (estimated). ``entity_boost``: weight of the query's proper nouns, numbers and codes in
        the BM25 half (memci_proxy.recall.lexical.entities). ``clock``: the time now, which dates "yesterday" or "May
        2nd" in a query (memci_proxy.recall.dates.asked). ``user_weight``: how many times a user message's terms count
        in its page's BM25 terms (memci_proxy.recall.reading.pagetext.index_terms)."""
        self.entity_boost = entity_boost
        self.clock = clock
        self.source = PageSource(repo)
        self.indexes = SearchIndexes(self.source, max_bytes=index_max_bytes, user_weight=user_weight)
        self.counter = counter
        self.hits = HitRenderer(self.source, counter)
        self.max_tokens = max_tokens
        self.vectors = vectors
        self.metrics = metrics
        self.lexical_weight = lexical_weight
        self.vector_weight = vector_weight
        self.min_cosine = min_cosine

    async def resolve(self, ctx: RecallContext, args: RecallArgs, limit: int | None = None, newest_first: bool = False,
                      excerpt_tokens: int | None = None, hits_shown: int = SEARCH_HITS,
                      shown_if: Callable[[str], bool] | None = None, muted: frozenset[str] = frozenset(),
                      keep: str | None = None, reply_first: bool = False, counting: bool = False) -> RecallOutcome:
        """``limit``: tokens the answer may take (the room left in the prompt budget); at most recall_max_tokens.
        ``newest_first``: the search's hits shown newest page first (a fact said again later comes first), their
        excerpts shortened, then the lowest-ranked hits left out, until they fit
        (memci_proxy.recall.reading.hits.HitRenderer.fitted);
        ``excerpt_tokens``: tokens shown of each hit, in any script (default: ``EXCERPT_CHARS`` characters);
        ``hits_shown``: how many search hits; ``shown_if(label)``: whether a hit below the best one may be shown
        (the five best searched, those it refuses left out); ``muted``: query terms that weigh nothing (when others
        remain); ``keep``: a page the hits must hold, second when the search did not rank it among them;
        ``reply_first``: the excerpts placed in the assistant's words before the user's where the terms meet in
        both (a question about what the assistant said); ``counting``: the search's query stands for a message that
        asks for a count (``search``)."""
        parts: list[str] = []
        returned: list[str] = []
        hits: list[tuple[str, float]] = []
        seconds = 0.0
        cap = self.max_tokens if limit is None else max(0, min(self.max_tokens, limit))
        args, reads = offloaded_reads(ctx.state, args)
        for read in reads:
            parts.append(await self._read_offloaded(ctx, read, cap // max(1, len(reads))))
        if args.pages:
            parts.extend(await self._pages(ctx, args.pages, returned))
        if args.query:
            started = time.perf_counter()
            hits = await self.search(ctx, args.query, hits_shown if shown_if is None else SEARCH_HITS, muted=muted,
                                     counting=counting)
            if shown_if is not None:
                hits = allowed_hits(hits, shown_if)[:hits_shown]
            if keep is not None and hits and keep not in {label for label, _ in hits}:
                hits = [hits[0], (keep, 0.0), *hits[1:]][:max(2, hits_shown)]
            seconds = time.perf_counter() - started
            user_place = 1 / USER_PLACE_WEIGHT if reply_first else USER_PLACE_WEIGHT
            parts.append(await self.hits.fitted(ctx, await self.archive_index(ctx), args.query, hits, cap, newest_first,
                                                 excerpt_tokens, user_place))
            if ctx.end_user and shown_if is None:  # a model's own search: the user's other conversations too
                parts.append(await self._other_conversations(ctx, args.query))
        if args.problems:
            parts.append("Note: " + "; ".join(args.problems) + ".")
        kind = "+".join(k for k, on in (("offloaded", bool(reads)), ("pages", bool(args.pages)),
                                         ("query", bool(args.query))) if on) or "invalid"
        if cap < 64:
            text = ("The context window has no room left for recalled text in this answer: answer with what you "
                    "have, or ask the user to continue in a new message.")
            return RecallOutcome(text, kind, [], hits, seconds)
        return RecallOutcome(self._cut("\n\n".join(parts), cap), kind, returned, hits, seconds)

    def embed_queries_soon(self, queries: Sequence[str]) -> None:
        """The vectors of the queries a turn will search for, started in one forward pass (searched one after the
        other, each would wait for a pass of its own)."""
        soon = getattr(getattr(self.vectors, "embedder", None), "embed_queries_soon", None)
        if soon is not None:
            soon([vector_query(q) for q in queries])

    @property
    def embeds_archived_pages(self) -> bool:
        """Whether archived pages are embedded after the turn that archived them (in the background)."""
        return self.vectors is not None

    async def search(
        self, ctx: RecallContext, query: str, k: int, use_vectors: bool = True, muted: frozenset[str] = frozenset(),
        counting: bool = False, vector_text: str | None = None,
    ) -> list[tuple[str, float]]:
        """Best-first (page label, score): BM25 scores when lexical only, reciprocal-rank-fusion scores when
        fused with the vector ranking (memci_proxy.recall.search.ranking: the top lexical hits stay first). Each page at
        most once. When the query names days ("yesterday", "on May 2nd"), the pages of those days (and after them)
        join the candidates and climb the ranking (lexical scores are kept, the floors of the push and of memory
        injection compare them). A query that asks for a count, or ``counting`` (it stands for a message that does),
        weighs the counted forms of its terms too (memci_proxy.recall.search.ranking.query_weights). ``vector_text``:
        the text whose vector ranks the candidates in the vector half (default: the query)."""
        added: dict[str, str] = {}
        index = await self.indexes.index_for(ctx, added)
        if self.vectors is not None:
            self.vectors.remember(ctx.conversation_id, added)
        days = preferred_days(query, day_of(self.clock()), lambda: self._days(ctx))
        weights = query_weights(query, self.entity_boost, counting)
        weights = {term: weight for term, weight in weights.items()
                   if term.removeprefix(COUNTED) not in muted} or weights
        candidates = max(k * FUSION_CANDIDATES, k)
        if self.vectors is None or not use_vectors:
            if self.vectors is None and use_vectors:
                self._fallback("not_configured")
            found = lexical_candidates(index, weights, k if days is None else candidates, days)
            return self._labelled(lexical_ranking(found, days))[:k]
        vector_text = vector_text or query
        if isinstance(self.vectors, CandidateVectors):
            if len(index):  # the query's vector computed (a worker thread) while the lexical candidates are found
                self.embed_queries_soon([vector_text])
            lexical = self._labelled(lexical_candidates(index, weights, candidates, days))
            vector_task = asyncio.ensure_future(self._candidate_cosines(ctx, vector_query(vector_text), lexical))
        else:
            # The query is embedded (a worker thread) while BM25 runs here: started first, awaited after.
            vector_task = asyncio.ensure_future(
                self.vectors.nearest(ctx.tenant, ctx.conversation_id, vector_query(vector_text), candidates))
            try:
                await asyncio.sleep(0)
                lexical = self._labelled(lexical_candidates(index, weights, candidates, days))
            except BaseException:
                vector_task.cancel()
                raise
        try:
            nearest = await vector_task
        except VectorSearchFailed as failure:
            self._fallback(failure.reason)
            return lexical_ranking(lexical, days)[:k]
        if isinstance(self.vectors, CandidateVectors):
            # every lexical candidate in the vector ranking: a floor would push down those it drops, below the rest
            vector, floor = nearest, None
        else:
            # archived pages of this state, and only those the query resembles at all (an empty page's zero vector
            # has cosine 0 with any query, pgvector's NaN)
            vector = [(label, cosine) for label, cosine in nearest if label in index and cosine > 0]
            floor = self.min_cosine
        fused = fuse(lexical, vector, max(candidates, len(lexical)), days, self.lexical_weight, self.vector_weight,
                     floor)
        return fused[:k]

    async def _candidate_cosines(self, ctx: RecallContext, query: str, lexical: list[tuple[str, float]]
                                 ) -> list[tuple[str, float]]:
        """Cosines of the lexical candidates that have a vector, each that of its best view
        (memci_proxy.recall.search.ranking.candidate_views; views without a vector are embedded in the background,
        CandidateVectors)."""
        assert isinstance(self.vectors, CandidateVectors)
        keys, pairs, text_of = self._views(ctx, [label for label, _ in lexical])
        cosines = await self.vectors.cosines(query, pairs, text_of, _views_wanted(keys))
        return best_views((keys[key], cosine) for key, cosine in cosines)

    def _views(self, ctx: RecallContext, labels: list[str]) -> tuple[
            dict[str, tuple[str, str]], list[tuple[str, str]], Callable[[str], Awaitable[str]]]:
        """The pages' views as the vector half embeds them: key -> (label, view), (key, digest of its text) and
        ``text_of(key)``."""
        digests = {PAGE: self.indexes.digests(ctx.conversation_id),
                   USER: self.indexes.user_digests(ctx.conversation_id)}
        users, pages = digests[USER], digests[PAGE]
        # a page of user words only has one view
        views = candidate_views((label for label in labels if label in pages),
                                lambda label: users.get(label, pages[label]) != pages[label])
        keys = {_view_key(label, view): (label, view) for label, view in views}
        read: dict[str, list[dict[str, Any]] | None] = {}

        async def text_of(key: str) -> str:
            label, view = keys[key]
            if label not in read:
                read[label] = await self._page_messages(ctx, label)
            full = read[label]
            if full is None:
                return ""
            return (user_text if view == USER else vector_text)(full, ctx.image_descriptions)  # as indexed

        return keys, [(key, digests[view][label]) for key, (label, view) in keys.items()], text_of

    async def _page_messages(self, ctx: RecallContext, label: str) -> list[dict[str, Any]] | None:
        """The page's own messages, as indexed: without its hidden recall rounds (None: no such page)."""
        record = page_or_offload(ctx.state, label)
        if record is None:
            return None
        return await self.source.messages(ctx, record.start, record.end)

    @staticmethod
    def _days(ctx: RecallContext) -> dict[str, _dt.date]:
        """The day of each archived page, by label."""
        return {p.label: day_of(p.first_seen) for p in ctx.state.pages if p.status != ACTIVE}

    @staticmethod
    def _labelled(ranking: list[tuple[Any, float]]) -> list[tuple[str, float]]:
        return [(str(label), score) for label, score in ranking]

    async def archive_index(self, ctx: RecallContext) -> BM25Index:
        """The conversation's BM25 index of archived pages, brought up to date (pages new to it go to the vector
        half too)."""
        added: dict[str, str] = {}
        index = await self.indexes.index_for(ctx, added)
        if self.vectors is not None:
            self.vectors.remember(ctx.conversation_id, added)
        return index

    def prepare_active(self, ctx: RecallContext) -> int:
        """Behind an answer: the terms of the conversation's complete active pages read ahead of the epoch that
        archives them (memci_proxy.recall.search.indexes.SearchIndexes.prepare_active)."""
        return self.indexes.prepare_active(ctx)

    async def prepare(self, ctx: RecallContext) -> None:
        """Index the pages archived since the last call, lexically and (in the background) as vectors: run after
        the turn that archived them, so that the next search has only the query to embed."""
        await self.archive_index(ctx)
        if isinstance(self.vectors, CandidateVectors):
            keys, views, text_of = self._views(ctx, self.vectors.take_remembered(ctx.conversation_id))
            self.vectors.prefetch(views, text_of, _views_wanted(keys))
        elif self.vectors is not None:
            await self.vectors.prepare(ctx.tenant, ctx.conversation_id)

    async def close(self) -> None:
        if self.vectors is not None:
            await self.vectors.close()

    def _fallback(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.recall_fallbacks.labels(reason).inc()

    async def _read_offloaded(self, ctx: RecallContext, read: OffloadRead, cap: int) -> str:
        record, lines, query = read.record, read.lines, read.query
        (message,) = await self.source.messages(ctx, record.entry, record.entry + 1)
        text = output_text(message) or ""
        if query:
            how, part = "search", search_lines(record, text, query, cap, self.counter)
        elif read.chars is not None:
            how, part = "chars", read_chars(record, text, read.chars[0], read.chars[1], cap, self.counter)
        else:
            how = "lines" if lines is not None else "start"
            first, last = lines if lines is not None else (1, 1 << 30)
            part = read_lines(record, text, first, last, cap, self.counter)
        if hasattr(self.metrics, "offload_reads"):
            self.metrics.child(self.metrics.offload_reads, how).inc()
        return part

    async def _other_conversations(self, ctx: RecallContext, query: str) -> str:
        """The best pages of the user's other conversations for ``query``, rendered."""
        hits, idf = await self.other_conversations(ctx.tenant, ctx.end_user, ctx.conversation_id, query)
        return across.render(query, hits, idf, EXCERPT_CHARS)

    async def other_conversations(self, tenant: str, end_user: str, conversation_id: str, query: str,
                                  k: int = SEARCH_HITS
                                  ) -> tuple[list[tuple[across.Candidate, float]], dict[str, float]]:
        """The best ``k`` pages for ``query`` among the end user's conversations other than ``conversation_id``
        (memci_proxy.recall.users.search), with the query terms' idf; none without a user."""
        return await search_user(self.source.repo, tenant, end_user, conversation_id, query, k)

    async def _other_page(self, ctx: RecallContext, label: str) -> str | None:
        """A page of another conversation of the user, by its label (``<conversation>/<page>``); None: not such a
        label."""
        parts = across.parse_label(label) if ctx.end_user else None
        reader = getattr(self.source.repo, "user_page", None)
        if parts is None or reader is None:
            return None
        page = await reader(ctx.tenant, ctx.end_user, *parts)
        return across.render_page(page) if page is not None else f"[Page {label}] does not exist."

    async def _pages(self, ctx: RecallContext, labels: list[str], returned: list[str]) -> list[str]:
        out: list[str] = []
        state = ctx.state
        for label in labels:
            other = await self._other_page(ctx, label)
            if other is not None:
                out.append(other)
                continue
            try:
                position = find_page(state, label)
            except ValueError:
                position = None
            if position is None:
                out.append(f"[Page {label}] does not exist. {self._known_pages(state)}")
                continue
            record = state.pages[position]
            if record.status == ACTIVE:
                out.append(f"[Page {record.label}] is not archived: its messages are in the conversation above.")
                continue
            start, end = page_entry_range(state, record.label) or (record.start, record.end)
            messages = await self.source.messages(ctx, start, end)
            hidden = page_hidden_messages(state, record.label)
            full = page_messages_with_hidden(messages, start, hidden)
            out.append(render_page(record.label, record.first_seen, STATUS_NAMES[record.status], full,
                                   ctx.image_descriptions))
            returned.append(record.label)
        return out

    async def hit_pages(self, ctx: RecallContext, hits: list[tuple[str, float]]) -> list[FoundHit]:
        """Search hits with their page records and page texts (the messages as the search indexed them)."""
        return await self.hits.hit_pages(ctx, hits)

    @staticmethod
    def _known_pages(state: ConversationState) -> str:
        labels = [p.label for p in state.pages if p.status != ACTIVE]
        if not labels:
            return "No page is archived yet."
        shown = labels if len(labels) <= 12 else [*labels[:5], "…", *labels[-5:]]
        return "Archived pages: " + ", ".join(shown) + "."

    def _cut(self, text: str, cap: int) -> str:
        if self.counter.count_text(text) <= cap:
            return text
        # Keep the head; cut by an estimate of characters per token, then trim until it fits.
        limit = max(16, int(len(text) * cap / max(1, self.counter.count_text(text))))
        while limit > 16 and self.counter.count_text(text[:limit]) > cap - 24:
            limit = int(limit * 0.9)
        return text[:limit] + f"\n…[cut to {cap} tokens; recall fewer pages to read the rest]"
