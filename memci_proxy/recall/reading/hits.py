"""Search hits rendered for the model: each hit's page read (as the search indexed it), an excerpt placed where the
query's rare terms meet, the parts of the hit's user turn beside it (memci_proxy.recall.reading.neighbours), and,
for a pushed round shown newest first, the whole fitted into the room the answer has."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memci_proxy.engine import ConversationState, PageRecord, TokenCounter
from memci_proxy.engine.contents import utc_date
from memci_proxy.engine.offload_state import offload_page
from memci_proxy.engine.state import find_page
from memci_proxy.recall.lexical.bm25 import BM25Index
from memci_proxy.recall.lexical.text import tokenize
from memci_proxy.recall.reading.neighbours import part_after, part_before
from memci_proxy.recall.reading.pagetext import USER_PLACE_WEIGHT, excerpt, index_text, message_text
from memci_proxy.recall.search.indexes import PageSource, RecallContext

EXCERPT_CHARS = 300  # characters shown of each search hit of a model's own call, in English ...
CALL_EXCERPT_TOKENS = EXCERPT_CHARS // 4  # ... as tokens, in any script: a Chinese page shows about 75 characters
MIN_EXCERPT_TOKENS = 8  # the narrowest window of a pushed round's hit, when nothing wider fits
WHOLE_MESSAGE_TOKENS = 320  # a pushed round's best hit shows the message that matched whole up to this size
# ... and each other hit up to this many times its excerpt's size (a user's fact is mostly one message of a few
# sentences: shown whole, not cut at both ends)
WHOLE_HIT_FACTOR = 2

Hit = tuple[str, float]  # (page label, score)
FoundHit = tuple[str, float, PageRecord, str]  # (label, score, record, page text)


def page_or_offload(state: ConversationState, label: str) -> PageRecord | None:
    """The record of a page label, an offloaded output's own (memci_proxy.engine.offload_state.offload_page)
    included."""
    position = find_page(state, label)
    return state.pages[position] if position is not None else offload_page(state, label)


def query_terms(query: str) -> list[str]:
    """The query's search terms worth locating in an excerpt."""
    return [t for t in tokenize(query) if len(t) > 1]


@dataclass
class ReadHits:
    """Search hits as read for rendering (HitRenderer.read)."""

    terms: list[str]  # the query's terms located in the excerpts
    weights: dict[str, float]  # their idf in the archive
    found: list[FoundHit]  # the hits found
    beside: dict[str, list[str]]  # hit label -> the parts of its turn to show beside it
    neighbours: dict[str, tuple[PageRecord, str]]  # those parts' records and texts
    user_place: float = USER_PLACE_WEIGHT  # what a place in a user message counts where an excerpt is placed


class HitRenderer:
    """Reads and renders a search's hits; ``source`` reads a conversation's messages, ``counter`` counts tokens."""

    def __init__(self, source: PageSource, counter: TokenCounter) -> None:
        self.source = source
        self.counter = counter

    async def fitted(self, ctx: RecallContext, index: BM25Index, query: str, hits: list[Hit], cap: int,
                     newest_first: bool, excerpt_tokens: int | None, user_place: float = USER_PLACE_WEIGHT) -> str:
        """The hits rendered; newest first, within ``cap``: their excerpts shortened (to half), then the
        lowest-ranked hits left out, so that the best hit always shows whole (shown newest first, the oldest would
        otherwise be the one cut off, and a fact said once long ago is the oldest). The pages are read once,
        whatever the number of renderings. ``index``: the archive's, whose idf places the excerpts."""
        read = await self.read(ctx, index, query, hits, user_place)
        rendered = self.render(query, hits, read, newest_first, tokens_each=excerpt_tokens)
        if not newest_first or self.counter.count_text(rendered) <= cap:
            return rendered
        shorter = (excerpt_tokens or EXCERPT_CHARS // 4) // 2
        rendered = self.render(query, hits, read, newest_first, tokens_each=shorter)
        while len(hits) > 1 and self.counter.count_text(rendered) > cap:
            hits = hits[:-1]
            rendered = self.render(query, hits, read, newest_first, tokens_each=shorter)
        while shorter > MIN_EXCERPT_TOKENS and self.counter.count_text(rendered) > cap:
            # the best hit alone, still too long beside its header: its window narrowed (the message that matched
            # still whole when short), not the whole answer cut at the end of the room
            shorter = max(MIN_EXCERPT_TOKENS, shorter // 2)
            rendered = self.render(query, hits, read, newest_first, tokens_each=shorter, tight=True)
        return rendered

    async def read(self, ctx: RecallContext, index: BM25Index, query: str, hits: list[Hit],
                   user_place: float = USER_PLACE_WEIGHT) -> ReadHits:
        """What rendering ``hits`` (or any first part of them) needs: their pages, the parts of their turns beside
        each (memci_proxy.recall.reading.neighbours) and the query terms' idf in the archive (a rare term places the
        excerpt before a common one)."""
        terms = query_terms(query)
        found = await self.hit_pages(ctx, hits)
        beside = {label: await self._neighbours(ctx, record, terms) for label, _score, record, _text in found}
        wanted = list(dict.fromkeys(n for labels in beside.values() for n in labels))
        neighbours = {label: (record, text) for label, _score, record, text in
                      await self.hit_pages(ctx, [(n, 0.0) for n in wanted])}
        return ReadHits(terms, {term: index.idf(term) for term in terms}, found, beside, neighbours, user_place)

    def render(self, query: str, hits: list[Hit], read: ReadHits, newest_first: bool = False,
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

    async def hit_pages(self, ctx: RecallContext, hits: list[Hit]) -> list[FoundHit]:
        """Search hits with their page records and page texts (the messages as the search indexed them)."""
        out = []
        for label, score in hits:
            record = page_or_offload(ctx.state, label)
            if record is None:
                continue
            messages = await self.source.messages(ctx, record.start, record.end)
            out.append((label, score, record, index_text(messages, ctx.image_descriptions)))
        return out
