"""Text helpers of the workers: page text for prompts, token estimates, cutting, facts parsing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import xxhash

from memci_proxy.recall.push.memory_block import estimate_tokens
from memci_proxy.recall.reading.pagetext import message_text

__all__ = ["estimate_tokens", "messages_text", "batches", "cut_to_tokens", "parse_facts", "fact_digest"]


def messages_text(messages: Iterable[dict[str, Any]], message_chars: int) -> str:
    """One line per message as memci_proxy.recall.reading.pagetext.message_text labels it (its role once), each cut to
    about ``message_chars`` characters after its label."""
    lines = []
    for message in messages:
        role = message.get("role") or "?"
        text = " ".join(message_text(message).split())  # labelled by its role already ("user: …", "tool: …",
        if text:                                          # "assistant called f(…)")
            lines.append(text[:len(role) + 2 + message_chars])
    return "\n".join(lines)


def batches(texts: Sequence[tuple[Any, str]], limit_chars: int) -> list[list[tuple[Any, str]]]:
    """Consecutive groups whose joined text stays under ``limit_chars`` (an item larger alone is one group)."""
    out: list[list[tuple[Any, str]]] = []
    size = 0
    for item in texts:
        if out and size + len(item[1]) <= limit_chars:
            out[-1].append(item)
            size += len(item[1])
        else:
            out.append([item])
            size = len(item[1])
    return out


def cut_to_tokens(text: str, tokens: int) -> str:
    if estimate_tokens(text) <= tokens:
        return text
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_tokens(text[:mid]) <= tokens - 1:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo].rstrip() + "…"


def parse_facts(answer: str, limit_chars: int = 200) -> list[str]:
    """'- fact' lines of the model's answer (NONE or prose: none)."""
    facts = []
    for line in answer.splitlines():
        line = line.strip()
        if line[:1] in "-*•" and len(line) > 2:
            fact = " ".join(line[1:].split())[:limit_chars]
            if fact and fact.upper() != "NONE":
                facts.append(fact)
    return facts


def fact_digest(fact: str) -> str:
    return xxhash.xxh3_64_hexdigest(" ".join(fact.lower().split()).encode())
