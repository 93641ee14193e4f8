"""Answering a recall call: archived pages by number, or a search over every archived page (evicted too)."""

from __future__ import annotations

import asyncio
import datetime as _dt
import time
from dataclasses import dataclass, field, replace
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from memci_proxy.engine import ACTIVE, ConversationState, PageRecord, TokenCounter, page_entry_range, page_hidden_messages
from memci_proxy.engine.contents import utc_date
from memci_proxy.engine.output_preview import OffloadRecord, output_text
from memci_proxy.engine.offload_state import find_offload, offload_page
from memci_proxy.engine.state import STATUS_NAMES, find_page
from memci_proxy.recall.users import across
from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.vectors.candidates import CandidateVectors
from memci_proxy.recall.lexical.counting import COUNTED
from memci_proxy.recall.dates.asked import day_of
from memci_proxy.recall.reading.neighbours import part_after, part_before
from memci_proxy.recall.reading.offloads import OffloadRead, read_chars, read_lines, search_lines
from memci_proxy.recall.reading.pagetext import (USER_PLACE_WEIGHT, excerpt, index_text, message_text,
                                                 page_messages_with_hidden, render_page, user_text, vector_text)
from memci_proxy.recall.search.ranking import (PAGE, USER, archived_view_wanted, best_views, candidate_views, fuse,
                                               lexical_candidates, lexical_ranking, preferred_days, query_weights,
                                               vector_query)
from memci_proxy.recall.search.indexes import PageSource, RecallContext, SearchIndexes
from memci_proxy.recall.lexical.text import tokenize
from memci_proxy.recall.tool.schema import RecallArgs
from memci_proxy.recall.users.search import search_user
from memci_proxy.recall.vectors.index import PageVectors, VectorSearchFailed
from memci_proxy.store.ports import ConversationRepository

SEARCH_HITS = 5
FUSION_CANDIDATES = 4  # each ranking contributes up to k * this candidates to the fusion
EXCERPT_CHARS = 300  # characters shown of each search hit of a model's own call, in English ...
CALL_EXCERPT_TOKENS = EXCERPT_CHARS // 4  # ... as tokens, in any script: a Chinese page shows about 75 characters
MIN_EXCERPT_TOKENS = 8  # the narrowest window of a pushed round's hit, when nothing wider fits
WHOLE_MESSAGE_TOKENS = 320  # a pushed round's best hit shows the message that matched whole up to this size
# ... and each other hit up to this many times its excerpt's size (a user's fact is mostly one message of a few
# sentences: shown whole, not cut at both ends)
WHOLE_HIT_FACTOR = 2


@dataclass
class RecallOutcome:
    text: str
    kind: str  # "pages" | "query" | "pages+query" | "invalid"
    pages: list[str] = field(default_factory=list)  # pages returned in full (recall statistics)
    hits: list[tuple[str, float]] = field(default_factory=list)
    search_seconds: float = 0.0


@dataclass
class _ReadHits:
    """Search hits as read for rendering (RecallResolver._read_hits)."""

    terms: list[str]  # the query's terms located in the excerpts
    weights: dict[str, float]  # their idf in the archive
    found: list[tuple[str, float, PageRecord, str]]  # (label, score, record, page text) of the hits found
    beside: dict[str, list[str]]  # hit label -> the parts of its turn to show beside it
    neighbours: dict[str, tuple[PageRecord, str]]  # those parts' records and texts
    user_place: float = USER_PLACE_WEIGHT  # what a place in a user message counts where an excerpt is placed


def page_or_offload(state: ConversationState, label: str) -> PageRecord | None:
    """The record of a page label, an offloaded output's own (memci_proxy.engine.offload_state.offload_page) included."""
    position = find_page(state, label)
    return state.pages[position] if position is not None else offload_page(state, label)


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


def query_terms(query: str) -> list[str]:
    """The query's search terms worth locating in an excerpt."""
    return [t for t in tokenize(query) if len(t) > 1]


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
        excerpts shortened, then the lowest-ranked hits left out, until they fit (memci_proxy.recall.resolver._fitted_hits);
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
        args, reads = self._offloaded_reads(ctx.state, args)
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
            parts.append(await self._fitted_hits(ctx, args.query, hits, cap, newest_first, excerpt_tokens, user_place))
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

    @staticmethod
    def _offloaded_reads(state: ConversationState, args: RecallArgs) -> tuple[RecallArgs, list[OffloadRead]]:
        """The reads of offloaded outputs the arguments ask for, and the arguments left for the archive: `page` with
        `lines`, `chars` or `query` (also one of `pages` with a `query`) reads inside an offloaded output; an
        offloaded output among `pages` is read from its first line."""
        if not state.offloads and not getattr(args, "page", ""):  # (duck-typed arguments have pages and query only)
            return args, []
        pages, query, problems = list(args.pages), args.query, list(args.problems)
        target = args.page
        if not target and len(pages) == 1 and query and find_offload(state, pages[0]) is not None:
            target = pages.pop()
        reads: list[OffloadRead] = []
        if target:
            record = find_offload(state, target)
            if record is None:
                if args.lines is not None or args.chars is not None or query:
                    problems.append(f"page {target} is not an offloaded output: `lines`, `chars` and a search within "
                                    "a page apply to those; it is read in full")
                if target not in pages:
                    pages.append(target)
            else:
                reads.append(OffloadRead(record, args.lines, query, args.chars))
                query = ""
        rest = []
        for label in pages:
            record = find_offload(state, label)
            if record is None:
                rest.append(label)
            elif all(r.record is not record for r in reads):
                reads.append(OffloadRead(record))
        return replace(args, pages=rest, query=query, problems=problems), reads

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
                                  k: int = SEARCH_HITS) -> tuple[list[tuple[across.Candidate, float]], dict[str, float]]:
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

    async def _fitted_hits(self, ctx: RecallContext, query: str, hits: list[tuple[str, float]], cap: int,
                           newest_first: bool, excerpt_tokens: int | None,
                           user_place: float = USER_PLACE_WEIGHT) -> str:
        """The hits rendered; newest first, within ``cap``: their excerpts shortened (to half), then the
        lowest-ranked hits left out, so that the best hit always shows whole (shown newest first, the oldest would
        otherwise be the one cut off, and a fact said once long ago is the oldest). The pages are read once,
        whatever the number of renderings."""
        read = await self._read_hits(ctx, query, hits, user_place)
        rendered = self._render_hits(query, hits, read, newest_first, tokens_each=excerpt_tokens)
        if not newest_first or self.counter.count_text(rendered) <= cap:
            return rendered
        shorter = (excerpt_tokens or EXCERPT_CHARS // 4) // 2
        rendered = self._render_hits(query, hits, read, newest_first, tokens_each=shorter)
        while len(hits) > 1 and self.counter.count_text(rendered) > cap:
            hits = hits[:-1]
            rendered = self._render_hits(query, hits, read, newest_first, tokens_each=shorter)
        while shorter > MIN_EXCERPT_TOKENS and self.counter.count_text(rendered) > cap:
            # the best hit alone, still too long beside its header: its window narrowed (the message that matched
            # still whole when short), not the whole answer cut at the end of the room
            shorter = max(MIN_EXCERPT_TOKENS, shorter // 2)
            rendered = self._render_hits(query, hits, read, newest_first, tokens_each=shorter, tight=True)
        return rendered

    async def _read_hits(self, ctx: RecallContext, query: str, hits: list[tuple[str, float]],
                         user_place: float = USER_PLACE_WEIGHT) -> _ReadHits:
        """What rendering ``hits`` (or any first part of them) needs: their pages, the parts of their turns beside
        each (memci_proxy.recall.reading.neighbours) and the query terms' idf in the archive (a rare term places the
        excerpt before a common one)."""
        terms = query_terms(query)
        index = await self.archive_index(ctx)
        found = await self.hit_pages(ctx, hits)
        beside = {label: await self._neighbours(ctx, record, terms) for label, _score, record, _text in found}
        wanted = list(dict.fromkeys(n for labels in beside.values() for n in labels))
        neighbours = {label: (record, text) for label, _score, record, text in
                      await self.hit_pages(ctx, [(n, 0.0) for n in wanted])}
        return _ReadHits(terms, {term: index.idf(term) for term in terms}, found, beside, neighbours, user_place)

    def _render_hits(self, query: str, hits: list[tuple[str, float]], read: _ReadHits, newest_first: bool = False,
                     tokens_each: int | None = None, tight: bool = False) -> str:
        """``tokens_each``: tokens shown of each hit, twice that of the best one, as characters of its own text (a
        Chinese page has about four times fewer characters per token than an English one); default
        ``EXCERPT_CHARS`` characters."""
        if not hits:
            return f"No archived page matches {query!r}."
        terms, weights = read.terms, read.weights
        order = "newest first" if newest_first else "best first"
        lines = [f"Archived pages matching {query!r} ({order}; recall a page by number to read it in full):"]
        shown = {label for label, _ in hits}
        found = [hit for hit in read.found if hit[0] in shown]
        if newest_first:
            found.sort(key=lambda hit: -hit[2].start)
        best = hits[0][0]
        for label, score, record, text in found:
            chars, whole, second = self._excerpt_chars(text, None), 0, 0
            if tokens_each is not None:
                # the message that matched, whole if short (the best hit's longer); and a second window where the
                # rare terms the first one lacks are (the user's request shown, then the passage of the reply)
                in_chars = self._chars_of(text)
                chars, whole, second = (in_chars(tokens_each), in_chars(WHOLE_HIT_FACTOR * tokens_each),
                                        in_chars(tokens_each))
                if label == best:  # (``tight``: its message whole only as short as another hit's)
                    chars, whole = in_chars(2 * tokens_each), in_chars(
                        WHOLE_HIT_FACTOR * tokens_each if tight else WHOLE_MESSAGE_TOKENS)
            lines.append(f"[Page {label}] {utc_date(record.first_seen)}, score {score:.2f}: "
                         f"{excerpt(text, terms, chars, whole, weights, second, read.user_place)}")
            beside = [n for n in read.beside[label] if n not in shown]
            shown.update(beside)
            for neighbour in beside:
                if neighbour not in read.neighbours:
                    continue
                other, other_text = read.neighbours[neighbour]
                part = excerpt(other_text, terms, self._excerpt_chars(other_text, tokens_each), 0, weights, 0,
                               read.user_place)
                lines.append(f"[Page {neighbour}] {utc_date(other.first_seen)}, the same turn as page {label}: {part}")
        return "\n".join(lines)

    def _excerpt_chars(self, text: str, tokens: int | None) -> int:
        return self._chars_of(text)(CALL_EXCERPT_TOKENS if tokens is None else tokens)

    def _chars_of(self, text: str) -> Callable[[int], int]:
        """Tokens -> characters of ``text`` (at least 24), from one count of its head: the script of the page's head
        is the script of its excerpt, mostly."""
        sample = text[:4 * EXCERPT_CHARS]
        length, count = len(sample), max(1, self.counter.count_text(sample))
        return lambda tokens: max(24, tokens * length // count)

    async def _neighbours(self, ctx: RecallContext, record: PageRecord, terms: list[str]) -> list[str]:
        """The parts of the hit's user turn to show beside it (memci_proxy.recall.reading.neighbours): the part before a
        continuation page; the part after, when a query term sits in the hit's last message."""
        beside = [label for label in (part_before(ctx.state, record.label),) if label is not None]
        after = part_after(ctx.state, record.label)
        if after is not None and record.end > record.start:
            (last,) = await self.source.messages(ctx, record.end - 1, record.end)
            if not set(terms).isdisjoint(tokenize(message_text(last))):
                beside.append(after)
        return beside

    async def hit_pages(
        self, ctx: RecallContext, hits: list[tuple[str, float]]
    ) -> list[tuple[str, float, PageRecord, str]]:
        """Search hits with their page records and page texts (the messages as the search indexed them)."""
        out = []
        for label, score in hits:
            record = page_or_offload(ctx.state, label)
            if record is None:
                continue
            messages = await self.source.messages(ctx, record.start, record.end)
            out.append((label, score, record, index_text(messages, ctx.image_descriptions)))
        return out

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
