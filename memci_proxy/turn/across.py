"""Memory across one end user's conversations, in the managed turn (memci_proxy.recall.users.across ranks and renders).

With a user id (memci_proxy.turn.end_user) and ``user_memory`` on:

* after each answer (``note``), the pages the turn added or grew are written to the user's index in the
  background: every page of every conversation counts, the active ones too (a short conversation is memory);
* before planning (``weigh``), a message that asks something (a question, a look-up, a count) is searched for
  among the user's other conversations, within ``user_memory_timeout_ms`` (past it, the turn goes on without);
  not when the user has no other conversation with pages yet (a first chat), nor when every term it names was found
  too common among the user's pages;
* the round (``exchange``): when the conversation's own archive pushed nothing, the hits are pushed as a recall
  round of the proxy's own, newest first, each labelled ``<conversation>/<page>`` with its date, kept in the history
  like any pushed round (the next turn's prefix is unchanged: cache-neutral).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.metrics import Metrics
from memci_proxy.engine import ConversationState
from memci_proxy.recall.users.across import (Candidate, is_short_number, page_counts, query_terms, render, shown_labels,
                                             tagged_terms)
from memci_proxy.recall.users.search import search_user
from memci_proxy.recall.reading.pagetext import index_text
from memci_proxy.recall.push.proactive import (LOOK_UP_TERMS, asks_about_reply, is_look_up, push_call, recall_round,
                                               search_words)
from memci_proxy.recall.lexical.counting import counts
from memci_proxy.recall.push.salience import asks
from memci_proxy.store.ports import UserPageRow
from memci_proxy.turn.push import MIN_RESULT_TOKENS, charge_round, latest_user_text, round_room
from memci_proxy.turn.recall_rounds import TurnRecall

log = logging.getLogger("memci.turn")
HITS = 6  # most hits pushed (LongMemEval S, offline: reach 0.853 with 5, 0.874 with 6, 0.878 with 8)
MAX_PAGE_CHARS = 16_000  # of a page's text indexed and kept (a long tool output is an offloaded page of its own)
EXCERPT_CHARS = (320, 200, 120, 80)  # each hit's excerpt (the best's twice), shortened until the round fits
MAX_COMMON_TERMS = 512  # common terms remembered per user
PAGE_COUNT_TTL_S = 60.0  # a user's pages per conversation are read again after this long
ALONE_TTL_S = 5.0  # ... and this soon while none of them is another conversation's than the one asking
# pages gathered this long are written in one batch, each page once, with its text as it is then; a search of the
# user's pages writes this process's waiting pages of that user's other conversations first (not the asking one's:
# the search leaves it out; writing a page costs milliseconds, its terms' index updated)
FLUSH_DELAY_S = 0.05
MAX_PENDING_ROWS = 4096  # pages waiting at once; past it a turn's pages wait for the conversation's next turn
# the page of a message not answered yet waits this long for its answer, which the conversation's next request
# brings: written once, with it, instead of once without it and again with it (a search of the user's pages from
# another conversation, and closing, write it at once)
ANSWER_WAIT_S = 30.0
ANSWER_SWEEP_S = 1.0


@dataclass(frozen=True, slots=True)
class AcrossNeed:
    """What the user's other conversations hold for the latest message, found before planning."""

    query: str  # the message's words searched, as the round shows them
    # the message asks about what the assistant said (memci_proxy.recall.push.proactive.asks_about_reply)
    reply_first: bool
    hits: list[tuple[Candidate, float]]
    idf: dict[str, float]  # of the query's terms among the candidates (placing each excerpt)


class UserMemory:
    def __init__(self, repo: Any, metrics: Metrics, enabled: bool, timeout_s: float) -> None:
        self.repo = repo
        self.metrics = metrics
        self.enabled = enabled and hasattr(repo, "user_page_candidates")
        self.timeout_s = timeout_s
        # (tenant, user) -> terms too common among the user's pages to name anything (a term's pages only grow): a
        # question naming nothing else is not searched again
        self._common: BoundedLru[tuple[str, str], frozenset[str]] = BoundedLru(
            "user_common_terms", 100_000, 32 * 2**20, size_of=lambda k, v: 128 + len(k[1]) + 64 * len(v))
        # (tenant, user) -> (conversation, page) -> (the turn's page, the messages it reads): its row made when written
        self._pending: dict[tuple[str, str], dict[tuple[str, str], tuple[UserTurn, list[dict[str, Any]]]]] = {}
        self._pending_rows = 0
        # (tenant, user) -> (conversation, page) -> (the turn's page, the messages it reads, when it was held): pages
        # whose last message waits for its answer
        self._unanswered: dict[tuple[str, str], dict[tuple[str, str], tuple[UserTurn, list[dict[str, Any]], float]]] = {}
        self._unanswered_rows = 0
        self._answer_wait: asyncio.Task[None] | None = None  # writes the pages whose answer did not come in time
        # (tenant, user) -> conversation -> its batches being written now (taken from _pending, not committed yet)
        self._writing: dict[tuple[str, str], dict[str, int]] = {}
        self._searches: set[asyncio.Task[Any]] = set()  # searches still running (past their deadline, too)
        self._flusher: asyncio.Task[None] | None = None  # the one waiting to write what is gathered
        self._flushes: set[asyncio.Task[None]] = set()  # those waiting or writing (closing waits for them)
        # (tenant, user) -> (when counted, the user's pages per conversation): whether another conversation has
        # any, and how specific a term is (their sum), recounted now and then; with the conversations whose pages
        # this process wrote since
        self._page_counts: BoundedLru[tuple[str, str], tuple[float, dict[str, int]]] = BoundedLru(
            "user_page_counts", 100_000, 16 * 2**20,
            size_of=lambda k, v: 96 + len(k[0]) + len(k[1]) + 96 * len(v[1]))

    # --- before planning ---------------------------------------------------------------------------------------
    async def weigh(self, tenant: str, end_user: str, conversation_id: str, state: ConversationState | None,
                    messages: list[dict[str, Any]]) -> AcrossNeed | None:
        text = latest_user_text(messages) if self.enabled and end_user else None
        if not text or not (asks(text) or is_look_up(text) or counts(text)):
            return None
        if self._alone(tenant, end_user, conversation_id, fresh_only=True):
            self._count("alone")  # the user's first conversation: no other one to search
            return None
        query = search_words(text, skip=LOOK_UP_TERMS) or search_words(text) or text[:200]
        known_common = self._common.get((tenant, end_user))
        if known_common is not None and all(t in known_common or is_short_number(t) for t in query_terms(query)):
            self._count("common")  # nothing the message names can be specific among the user's pages
            return None
        # past the deadline the turn goes on without; the search is not cancelled (no query is cut half done)
        search = asyncio.get_running_loop().create_task(
            self._search(tenant, end_user, conversation_id, query, text, state))
        self._searches.add(search)
        search.add_done_callback(self._searches.discard)
        done, _ = await asyncio.wait({search}, timeout=self.timeout_s)
        if not done:
            self._count("timeout")
            return None
        try:
            hits, idf = search.result()
        except Exception:
            log.exception("the search of the user's other conversations failed; no round from them this turn")
            self._count("failed")
            return None
        if not hits:
            self._count("no_hits" if idf else "alone" if self._alone(tenant, end_user, conversation_id) else "no_match")
            return None
        return AcrossNeed(query, asks_about_reply(text), hits, idf)

    async def _search(self, tenant: str, end_user: str, conversation_id: str, query: str, text: str,
                      state: ConversationState | None) -> tuple[list[tuple[Candidate, float]], dict[str, float]]:
        key = (tenant, end_user)
        if not self._fresh(key):
            counted = await self.repo.user_page_counts(tenant, end_user)
            # this process's pages not written yet, or being written (a count read meanwhile does not see them)
            for c in [*(c for c, _ in self._pending.get(key, {})), *(c for c, _ in self._unanswered.get(key, {})),
                      *self._writing.get(key, {})]:
                counted.setdefault(c, 1)
            self._page_counts.put(key, (time.monotonic(), counted))
        if self._alone(tenant, end_user, conversation_id):
            return [], {}
        self._answer_now(key, besides=conversation_id)
        if any(c != conversation_id for c, _ in self._pending.get(key, ())):  # searchable first
            await self._flush(key, conversation_id)
        common = set(self._common.get(key) or ())
        found = await search_user(self.repo, tenant, end_user, conversation_id, query, HITS, counting=counts(text),
                                  exclude=shown_labels(state),  # pushed on an earlier turn, still in the prompt
                                  user_pages=sum(self._page_counts.get(key)[1].values()), common=common)
        if common:
            self._common.put(key, frozenset(list(common)[-MAX_COMMON_TERMS:]))
        return found

    def _fresh(self, key: tuple[str, str]) -> bool:
        known = self._page_counts.peek(key)
        if known is None:
            return False
        ttl = PAGE_COUNT_TTL_S if len(known[1]) > 1 else ALONE_TTL_S
        return time.monotonic() - known[0] <= ttl

    def _alone(self, tenant: str, end_user: str, conversation_id: str, fresh_only: bool = False) -> bool:
        """Whether no conversation of the user but ``conversation_id`` has pages, as last counted (``fresh_only``:
        False unless that count is recent)."""
        key = (tenant, end_user)
        known = self._page_counts.peek(key)
        if known is None or (fresh_only and not self._fresh(key)):
            return False
        return not any(c != conversation_id for c in known[1])

    # --- the round -------------------------------------------------------------------------------------------------
    def exchange(self, turn: Any, rounds: TurnRecall, tool_name: str) -> list[dict[str, Any]]:
        """The round to append after the latest user message ([] when none fits)."""
        need: AcrossNeed | None = turn.across
        if need is None or turn.plan.over_budget:
            return []
        call = push_call(tool_name, need.query, f"u{turn.redo.last_index}")
        within, limit = round_room(turn, rounds, call)
        text = fitted(need, limit, rounds.resolver.counter.count_text)
        if text is None:
            self._count("no_room")
            return []
        exchange = recall_round(call, text)
        self._count("pushed")
        self.metrics.recall_push_tokens.observe(charge_round(rounds, exchange, within))
        return exchange

    # --- after the answer --------------------------------------------------------------------------------------
    def note(self, tenant: str, end_user: str, conversation_id: str, state: Any, messages: list[dict[str, Any]],
             first_new: int) -> None:
        """The pages holding the turn's new messages (from ``first_new``), written to the user's index in the
        background: gathered for ``FLUSH_DELAY_S`` (the newest text of a page wins), then written in one batch."""
        if not self.enabled or not end_user:
            return
        user = (tenant, end_user)
        waiting = self._pending.setdefault(user, {})
        open_turn = bool(messages) and messages[-1].get("role") != "assistant"  # its answer: the next request's
        noted = 0
        for turn in user_turns(tail_pages(state.pages, first_new)):
            if turn.end > first_new and turn.start < len(messages):
                key = (conversation_id, turn.label)
                if open_turn and turn.end >= len(messages):
                    self._hold(user, key, turn, messages)
                    noted += 1
                    continue
                self._take_held(user, [key])  # its answer came: written with it (below)
                if key not in waiting:
                    if self._pending_rows >= MAX_PENDING_ROWS:
                        self._count("write_skipped")
                        continue
                    self._pending_rows += 1
                waiting[key] = (turn, messages)
                noted += 1
        known = self._page_counts.peek((tenant, end_user))
        if noted and known is not None and conversation_id not in known[1]:  # this conversation has pages now
            self._page_counts.put((tenant, end_user), (known[0], {**known[1], conversation_id: noted}))
        self._flush_later()

    def _flush_later(self) -> None:
        """The pages gathered written in ``FLUSH_DELAY_S`` (with those gathered meanwhile)."""
        if self._pending_rows and self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())
            self._flushes.add(self._flusher)
            self._flusher.add_done_callback(self._flushes.discard)

    def _hold(self, user: tuple[str, str], key: tuple[str, str], turn: UserTurn, messages: list[dict[str, Any]]
              ) -> None:
        """The page of a message not answered yet, kept until its answer comes (or ``ANSWER_WAIT_S``)."""
        held = self._unanswered.setdefault(user, {})
        first = held.get(key)
        if first is None:
            if self._unanswered_rows >= MAX_PENDING_ROWS:
                self._count("write_skipped")
                if not held:
                    del self._unanswered[user]
                return
            self._unanswered_rows += 1
        held[key] = (turn, messages, time.monotonic() if first is None else first[2])  # (an agent's turn: its first)
        if self._answer_wait is None:
            self._answer_wait = asyncio.get_running_loop().create_task(self._answers_late())
            self._flushes.add(self._answer_wait)
            self._answer_wait.add_done_callback(self._flushes.discard)

    async def _answers_late(self) -> None:
        """The pages whose answer has not come after ``ANSWER_WAIT_S``: written as they are."""
        try:
            while self._unanswered:
                oldest = min((held_at for pages in self._unanswered.values() for _, _, held_at in pages.values()),
                             default=time.monotonic())
                # (at most one sweep a second: each reads every page held)
                await asyncio.sleep(max(ANSWER_SWEEP_S, oldest + ANSWER_WAIT_S - time.monotonic() + 0.001))
                due = time.monotonic() - ANSWER_WAIT_S
                for user in list(self._unanswered):
                    self._answer_now(user, due=due)
                self._flush_later()
        finally:
            self._answer_wait = None

    def _answer_now(self, user: tuple[str, str], besides: str = "", due: float | None = None) -> None:
        """The user's pages waiting for their answer (but ``besides``'s; ``due``: those held before it) join the
        pages to write."""
        held = self._unanswered.get(user)
        if not held:
            return
        waiting = self._pending.setdefault(user, {})
        keys = [k for k, (_, _, at) in held.items() if k[0] != besides and (due is None or at <= due)]
        for key, turn, messages in self._take_held(user, keys):
            if key not in waiting:
                self._pending_rows += 1
            waiting[key] = (turn, messages)

    def _take_held(self, user: tuple[str, str], keys: list[tuple[str, str]]
                   ) -> list[tuple[tuple[str, str], UserTurn, list[dict[str, Any]]]]:
        """Those of the user's pages waiting for their answer, taken from the wait."""
        held = self._unanswered.get(user)
        if not held:
            return []
        taken = [(key, *held.pop(key)[:2]) for key in keys if key in held]
        self._unanswered_rows -= len(taken)
        if not held:
            del self._unanswered[user]
        return taken

    async def _flush_soon(self) -> None:
        try:
            await asyncio.sleep(FLUSH_DELAY_S)
        finally:
            self._flusher = None
            await self._flush()

    async def _flush(self, user: tuple[str, str] | None = None, besides: str = "") -> None:
        """Write what is gathered (``user``: of that (tenant, user) alone; ``besides``: not that conversation's)."""
        if user is None:
            taken, self._pending = self._pending, {}
        else:
            waiting = self._pending.pop(user, {})
            kept = {k: v for k, v in waiting.items() if k[0] == besides}
            if kept:
                self._pending[user] = kept
            taken = {user: {k: v for k, v in waiting.items() if k[0] != besides}}
        batch = [(t, u, c, page_row(u, turn, messages))
                 for (t, u), pages in taken.items() for (c, _), (turn, messages) in pages.items()]
        self._pending_rows -= len(batch)
        if not batch:
            return
        writing = [((t, u), c) for t, u, c, _ in batch]
        for key, c in writing:
            conversations = self._writing.setdefault(key, {})
            conversations[c] = conversations.get(c, 0) + 1
        try:
            await self.repo.put_user_pages(batch)
        except Exception as exc:
            log.warning("could not index %d pages for their users (%s)", len(batch), exc)
            self.metrics.store_write_failures.labels("user_pages").inc()
        finally:
            for key, c in writing:
                conversations = self._writing[key]
                conversations[c] -= 1
                if not conversations[c]:
                    del conversations[c]
                if not conversations:
                    del self._writing[key]

    def forget_user(self, tenant: str, end_user: str) -> None:
        """After the user is deleted: what this process learnt of their pages goes (their waiting pages too)."""
        self._common.pop((tenant, end_user))
        self._page_counts.pop((tenant, end_user))
        self._pending_rows -= len(self._pending.pop((tenant, end_user), {}))
        self._unanswered_rows -= len(self._unanswered.pop((tenant, end_user), {}))

    async def close(self) -> None:
        """Write what is gathered now, and wait for the writes under way."""
        for user in list(self._unanswered):
            self._answer_now(user)
        for waiting in (self._flusher, self._answer_wait):
            if waiting is not None:
                waiting.cancel()  # (its wait: what it would write is written below)
        await asyncio.gather(*self._flushes, *self._searches, return_exceptions=True)
        await self._flush()

    def _count(self, outcome: str) -> None:
        self.metrics.child(self.metrics.user_memory_pushes, outcome).inc()


def fitted(need: AcrossNeed, limit: int, count: Any) -> str | None:
    """The round's text within ``limit`` tokens: every hit with the widest excerpts that fit, else the lowest-ranked
    hits left out; None when not even the best hit's narrowest excerpt fits."""
    if limit < MIN_RESULT_TOKENS:
        return None
    for shown in range(len(need.hits), 0, -1):
        for chars in EXCERPT_CHARS:
            text = render(need.query, need.hits[:shown], need.idf, chars, need.reply_first)
            if count(text) <= limit:
                return text
    return None


@dataclass(frozen=True, slots=True)
class UserTurn:
    """A page with its continuation pages ("12", "12.2", …): one user message and all that answered it."""

    label: str
    start: int
    end: int
    first_seen: float


def user_turns(pages: Any) -> list[UserTurn]:
    """The conversation's pages grouped by user turn: the user's memory indexes a turn whole (its continuation pages
    hold the answer's parts, which alone would crowd the hits with one turn)."""
    out: list[UserTurn] = []
    for record in pages:
        base = record.label.split(".", 1)[0]
        if out and out[-1].label == base:
            out[-1] = UserTurn(base, out[-1].start, max(out[-1].end, record.end), out[-1].first_seen)
        else:
            out.append(UserTurn(base, record.start, record.end, record.first_seen))
    return out


def tail_pages(pages: Any, first_new: int) -> Any:
    """The pages of the user turns that reach past entry ``first_new`` (the newest ones: a turn reads the
    conversation's tail, not its every page)."""
    first = len(pages)
    while first > 0 and pages[first - 1].end > first_new:
        first -= 1
    if first < len(pages):
        number = pages[first].number  # its continuation pages before first_new belong to its turn
        while first > 0 and pages[first - 1].number == number:
            first -= 1
    return pages[first:]


def page_row(end_user: str, turn: UserTurn, messages: list[dict[str, Any]]) -> UserPageRow:
    text = index_text(messages[turn.start:turn.end])[:MAX_PAGE_CHARS]
    counts, length = page_counts(text)
    return UserPageRow(turn.label, turn.start, turn.end - 1, turn.first_seen, text, tagged_terms(end_user, counts),
                       counts, length)


__all__ = ["AcrossNeed", "UserMemory", "UserTurn", "page_row", "tail_pages", "user_turns"]
