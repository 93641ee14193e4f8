"""B5: retrieved memory for this turn, in seed 001's "## Memory" format (pure, standard library only).

* ``memory_keywords(query, recent_texts)``: seed 001's keyword query: the keywords of the (rewritten)
  query first, then those of the last 5 messages, top 6 in all (``memci_proxy.recall.lexical.text.keywords``: regex
  ``[a-z0-9_]{2,}|[\\u4e00-\\u9fff]{2,}``, stop words removed).
* ``memory_query_text(query, previous_user_texts)``: the alternative query measured better on MADial-Bench
  (``loadtests/evals/eval_rewrite.py``): the rewritten query followed by the user's 5 previous messages (BM25
  recall@5 0.533 against 0.391 for the 6-keyword query and 0.436 for the last message alone).
* ``format_memory(hits)``: hits best first as ``(source, text)``; one line per hit ``[source] text``,
  whitespace collapsed, text cut at ``cut_chars`` characters followed by ``…[truncated]``; at most
  ``max_hits`` hits, added while the block stays within ``budget_tokens`` (CJK characters one token each,
  other characters one per four); ``""`` when there is no hit (nothing is injected).

Example::

    ## Memory
    [memory.md] The user prefers pnpm over npm.
    [page 12] Last deployment used Cloudflare Workers and hit timeouts …[truncated]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from memci_proxy.engine.markup import quote
from memci_proxy.recall.lexical.text import keywords

__all__ = [
    "MEMORY_HEADER",
    "TRUNCATED",
    "DEFAULT_MEMORY_BUDGET_TOKENS",
    "DEFAULT_MEMORY_MAX_HITS",
    "DEFAULT_MEMORY_CUT_CHARS",
    "DEFAULT_KEYWORDS",
    "DEFAULT_RECENT_MESSAGES",
    "estimate_tokens",
    "memory_keywords",
    "memory_query_text",
    "memory_line",
    "format_memory",
]

MEMORY_HEADER = "## Memory"
TRUNCATED = "…[truncated]"
DEFAULT_MEMORY_BUDGET_TOKENS = 2048
DEFAULT_MEMORY_MAX_HITS = 5
DEFAULT_MEMORY_CUT_CHARS = 300
DEFAULT_KEYWORDS = 6
DEFAULT_RECENT_MESSAGES = 5

_CJK = re.compile("[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")


def estimate_tokens(text: str) -> int:
    """CJK characters one token each, other characters one per four (rounded up)."""
    if not text:
        return 0
    cjk = 0 if text.isascii() else len(_CJK.findall(text))
    return cjk + (len(text) - cjk + 3) // 4


def memory_keywords(
    query: str, recent_texts: Sequence[str], top: int = DEFAULT_KEYWORDS, recent: int = DEFAULT_RECENT_MESSAGES
) -> list[str]:
    """Keywords of ``query`` first, then of the last ``recent`` texts, ``top`` in all, no repeats."""
    chosen = keywords(query, top=top)
    if len(chosen) < top and recent > 0:
        context = "\n".join(recent_texts[-recent:])
        for word in keywords(context, top=top + len(chosen)):
            if word not in chosen:
                chosen.append(word)
                if len(chosen) == top:
                    break
    return chosen


def memory_query_text(query: str, previous_user_texts: Sequence[str], recent: int = DEFAULT_RECENT_MESSAGES) -> str:
    """The search text for B5: ``query`` then the user's last ``recent`` earlier messages, one per line."""
    context = list(previous_user_texts[-recent:]) if recent > 0 else []
    return "\n".join(text for text in (query, *context) if text and text.strip())


def memory_line(source: str, text: str, cut_chars: int = DEFAULT_MEMORY_CUT_CHARS) -> str:
    """``[source] text`` on one line, the text cut at ``cut_chars`` characters with ``…[truncated]``."""
    flat = " ".join(text.split())
    if len(flat) > cut_chars:
        flat = flat[:cut_chars].rstrip() + TRUNCATED
    label = " ".join(source.split()).replace("]", ")")
    return f"[{label}] {quote(flat)}"  # quoted last, after the whitespace is collapsed and the text cut


def format_memory(
    hits: Sequence[tuple[str, str]],
    budget_tokens: int = DEFAULT_MEMORY_BUDGET_TOKENS,
    max_hits: int = DEFAULT_MEMORY_MAX_HITS,
    cut_chars: int = DEFAULT_MEMORY_CUT_CHARS,
    count_tokens: Callable[[str], int] = estimate_tokens,
) -> str:
    """The B5 block for ``hits`` (best first), or ``""`` when none is given or none fits the budget.

    Hits are taken in order and the first that would overflow the budget ends the block (seed 001:
    accumulate until the budget is approached). Identical lines are kept once.
    """
    if not hits or max_hits <= 0:
        return ""
    lines: list[str] = []
    seen: set[str] = set()
    used = count_tokens(MEMORY_HEADER) + 1
    for source, text in hits:
        if not text or not text.strip():
            continue
        line = memory_line(source, text, cut_chars)
        if line in seen:
            continue
        cost = count_tokens(line) + 1  # +1: the newline
        if used + cost > budget_tokens:
            break
        lines.append(line)
        seen.add(line)
        used += cost
        if len(lines) == max_hits:
            break
    return "\n".join([MEMORY_HEADER, *lines]) if lines else ""
