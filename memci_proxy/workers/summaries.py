"""The conversation summary (B4), its topics, and the end user's profile facts (B2a), from archived pages.

Each job takes the archived (or evicted) pages not yet taken in (``first_seq`` after the row's ``last_seq``),
in batches of ``batch_chars``; progress is stored after every batch. The summary is merged with the previous
one and re-compressed when over ``max_summary_tokens`` (seed 003): the old summary is compressed to about a
third, merged with the new part, and the whole compressed once more if still over (then cut). A failure
records the attempt with its back-off (``backoff.after_failure``); the fifth records ``archive_backlog``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memci_proxy.recall.lexical.text import keyword_counts, top_keywords
from memci_proxy.workers.backoff import BACKLOG_EVENT, after_failure
from memci_proxy.workers.config import MemoryConfig
from memci_proxy.workers.prefix import PROFILE_INSTRUCTION, SUMMARY_INSTRUCTION, SummaryBase, job_body, page_instruction
from memci_proxy.workers.summarizer import (COMPRESS_PROMPT, PAGES_PROMPT, PROFILE_PROMPT, AnsweredWithToolCall,
                                             PromptTooLong, Summarizer, SummaryFailed)
from memci_proxy.workers.text import batches, cut_to_tokens, estimate_tokens, fact_digest, messages_text, parse_facts

log = logging.getLogger("memci.workers")

DONE, NOTHING, BACKING_OFF, FAILED = "done", "nothing", "backing_off", "failed"


@dataclass
class PageText:
    number: str
    first_seq: int
    last_seq: int
    messages: int
    text: str
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)  # the page's messages as stored


async def new_archived_pages(
    repo: Any, tenant: str, conversation_id: str, after_seq: int, message_chars: int
) -> list[PageText]:
    pages = await repo.load_pages(tenant, conversation_id, after_seq=after_seq)
    if not pages:
        return []
    entries = await repo.load_entries(tenant, conversation_id, pages[0].first_seq, pages[-1].last_seq)
    by_seq = {e.seq: e.message for e in entries}
    out = []
    for p in pages:
        messages = [by_seq[s] for s in range(p.first_seq, p.last_seq + 1) if s in by_seq]
        out.append(PageText(p.number, p.first_seq, p.last_seq, len(messages), messages_text(messages, message_chars),
                            messages))
    return out


# (tenant, conversation, after message seq, message chars) -> the pages archived after that message (a job's reader:
# new_archived_pages on the repository, or the memory worker's, which hands one job's read to the other)
PageReader = Callable[[str, str, int, int], Awaitable[list[PageText]]]


def _reader(repo: Any) -> PageReader:
    return lambda tenant, conversation_id, after_seq, chars: new_archived_pages(repo, tenant, conversation_id,
                                                                                after_seq, chars)


def _rows(pages: list[PageText]) -> list[dict[str, Any]]:
    return [row for page in pages for row in page.rows]


def prefix_groups(pages: list[PageText], bases: Sequence[SummaryBase]
                  ) -> list[tuple[SummaryBase | None, list[PageText]]]:
    """Consecutive pages grouped by the newest base that still holds each of them (None: no base holds it); a page
    after the base's end joins the group when the group's pages and it go on past the base (``continuation``)."""
    groups: list[tuple[SummaryBase | None, list[PageText]]] = []
    for page in pages:
        current = groups[-1] if groups and groups[-1][0] is not None else None

        def holds(b: SummaryBase) -> bool:
            return b.holds(page.rows) or (current is not None and b is current[0] and b.continuation(
                [*_rows(current[1]), *page.rows]) is not None)

        base = next((b for b in reversed(bases) if holds(b)), None)
        if groups and groups[-1][0] is base:
            groups[-1][1].append(page)
        else:
            groups.append((base, [page]))
    return groups


async def answers(summarizer: Summarizer, pages: list[PageText], bases: Sequence[SummaryBase], prefix_template: str,
                  plain_prompt: str, max_tokens: int, batch_chars: int, on_call: Callable[[str], None] | None = None
                  ) -> AsyncIterator[tuple[list[PageText], str]]:
    """(pages, the model's answer) in order: pages a base still holds in one call on that base (its cached prefix
    plus the instruction); the others as today, the pages' text in batches under ``plain_prompt``. Raises
    SummaryFailed. ``on_call("prefix" | "plain")`` is told of every call."""
    on_call = on_call or (lambda kind: None)
    complete_after = getattr(summarizer, "complete_after", None)
    for base, group in prefix_groups(pages, bases if complete_after is not None else ()):
        if base is not None and complete_after is not None:
            instruction = page_instruction(prefix_template, group[0].rows[0], group[-1].rows[-1])
            on_call("prefix")
            answer = base.continuation(_rows(group))
            try:
                text = await complete_after(job_body(base.body, instruction, max_tokens, answer), base.base_url,
                                            base.auth)
            except (AnsweredWithToolCall, PromptTooLong):
                pass  # the conversation's tools tempted the model, or its prompt and the job's answer pass the
                # window: the plain prompt has no tools and is short
            else:
                yield group, text
                continue
        for batch in batches([(p, p.text) for p in group], batch_chars):
            on_call("plain")
            body = "\n\n".join(f"[page {p.number}]\n{t}" for p, t in batch)
            yield [p for p, _ in batch], await summarizer.complete(plain_prompt, body, max_tokens)


def _words(tokens: int) -> int:
    return max(10, (tokens * 3) // 4)


async def merge_summaries(summarizer: Summarizer, old: str, new: str, max_tokens: int) -> tuple[str, int]:
    """(merged text, compressions made). Seed 003: old to ~1/3, merged, the whole once more if still over."""
    merged = f"{old}\n\n{new}".strip()
    if estimate_tokens(merged) <= max_tokens:
        return merged, 0
    compressions = 0
    if old:
        target = max(16, estimate_tokens(old) // 3)
        old = await summarizer.complete(COMPRESS_PROMPT.format(words=_words(target)), old, target)
        compressions += 1
        merged = f"{old}\n\n{new}".strip()
    if estimate_tokens(merged) > max_tokens:
        merged = await summarizer.complete(COMPRESS_PROMPT.format(words=_words(max_tokens)), merged, max_tokens)
        compressions += 1
    return cut_to_tokens(merged, max_tokens), compressions


async def record_failure(repo: Any, tenant: str, conversation_id: str, kind: str, period: str, attempts: int,
                         now: dt.datetime, error: str) -> None:
    retry = after_failure(attempts, now)
    await repo.record_summary_failure(
        tenant, conversation_id, kind, period, retry.attempts, retry.next_attempt_at, error
    )
    log.warning("%s summary of %s %s failed (attempt %d, next at %s): %s", kind, conversation_id, period or "",
                retry.attempts, retry.next_attempt_at.isoformat(), error)
    if retry.backlog:
        await repo.add_event(tenant, conversation_id, BACKLOG_EVENT,
                             {"kind": kind, "period": period, "attempts": retry.attempts, "error": error[:200]})


def backing_off(row: Any, now: dt.datetime) -> bool:
    return row is not None and row.next_attempt_at is not None and row.next_attempt_at > now


async def update_conversation_summary(
    repo: Any, summarizer: Summarizer, config: MemoryConfig, tenant: str, conversation_id: str, now: dt.datetime,
    bases: Sequence[SummaryBase] = (), on_call: Callable[[str], None] | None = None,
    read_pages: PageReader | None = None,
) -> str:
    row = await repo.get_summary(tenant, conversation_id, "conversation")
    if backing_off(row, now):
        return BACKING_OFF
    watermark = row.last_seq if row is not None else -1
    pages = await (read_pages or _reader(repo))(tenant, conversation_id, watermark, config.message_chars)
    if not pages:
        return NOTHING
    await _store_topics(repo, config, tenant, conversation_id, pages, row.text if row is not None else "")
    text = row.text if row is not None else ""
    first = row.first_seq if row is not None and row.status == "done" else pages[0].first_seq
    count = row.message_count if row is not None else 0
    compressions = row.compressions if row is not None else 0
    try:
        async for batch, part in answers(summarizer, pages, bases, SUMMARY_INSTRUCTION, PAGES_PROMPT,
                                         max(32, config.max_summary_tokens // 2), config.batch_chars, on_call):
            text, made = await merge_summaries(summarizer, text, part, config.max_summary_tokens)
            compressions += made
            count += sum(p.messages for p in batch)
            await repo.put_summary(tenant, conversation_id, "conversation", "", text, estimate_tokens(text), first,
                                   batch[-1].last_seq, count, compressions)
    except SummaryFailed as exc:
        latest = await repo.get_summary(tenant, conversation_id, "conversation")
        await record_failure(repo, tenant, conversation_id, "conversation", "",
                             latest.attempts if latest is not None else 0, now, str(exc))
        return FAILED
    return DONE


async def _store_topics(repo: Any, config: MemoryConfig, tenant: str, conversation_id: str, pages: list[PageText],
                        summary: str) -> None:
    """Seed 001 keywords per page, and for the conversation over its summary and the new pages (the pages' counts
    added to the summary's: the keywords of the texts joined, each page's text read once)."""
    counts = [(p.number, keyword_counts(p.text)) for p in pages]
    topics = {number: top_keywords(c, config.topics_per_page) for number, c in counts}
    known = await repo.load_topics(tenant, conversation_id, [""])  # the conversation's, not every page's
    whole = keyword_counts(summary)
    for _, c in counts:
        whole.update(c)
    merged = list(dict.fromkeys([*top_keywords(whole, config.topics_per_conversation), *known.get("", [])]))
    topics[""] = merged[: config.topics_per_conversation]
    await repo.put_topics(tenant, conversation_id, {k: v for k, v in topics.items() if v or k == ""})


async def update_profile(
    repo: Any, summarizer: Summarizer, config: MemoryConfig, tenant: str, conversation_id: str, now: dt.datetime,
    bases: Sequence[SummaryBase] = (), on_call: Callable[[str], None] | None = None,
    read_pages: PageReader | None = None,
) -> str:
    """Stable facts about the conversation's end user (its own without a user id) from its newly archived pages."""
    row = await repo.get_summary(tenant, conversation_id, "profile")
    if backing_off(row, now):
        return BACKING_OFF
    pages = await (read_pages or _reader(repo))(tenant, conversation_id, row.last_seq if row else -1,
                                                config.message_chars)
    if not pages:
        return NOTHING
    count = row.message_count if row is not None else 0
    try:
        async for batch, answer in answers(summarizer, pages, bases, PROFILE_INSTRUCTION, PROFILE_PROMPT, 256,
                                           config.batch_chars, on_call):
            facts = parse_facts(answer)
            await repo.add_profile_facts(tenant, conversation_id, [(fact_digest(f), f) for f in facts])
            count += sum(p.messages for p in batch)
            await repo.put_summary(tenant, conversation_id, "profile", "", "", 0, pages[0].first_seq,
                                   batch[-1].last_seq, count)
    except SummaryFailed as exc:
        latest = await repo.get_summary(tenant, conversation_id, "profile")
        await record_failure(repo, tenant, conversation_id, "profile", "",
                             latest.attempts if latest is not None else 0, now, str(exc))
        return FAILED
    return DONE


def render_profile(facts: list[str]) -> str:
    return "\n".join(f"- {f}" for f in facts)
