"""The two context strategies this proxy is compared with, as small faithful client-side implementations.

Both run on the client's full message list before every request and return the messages to send.
Neither is part of the proxy; they exist so the cache benchmark and the load tests can measure them.

* ``SlidingWindow``: seed 002's SimpleCompressor. Token estimate ``(chars + 3) // 4`` per message; each
  message first cut to ``max_chars_per_message`` (4000); then, walking back from the newest message,
  keep messages while the running estimate fits the budget; the system prompt is always kept. Run every
  turn, so once the history is over budget the head of the prompt moves every turn.
* ``ThreeTier``: seed 003's memory middleware. Physical pruning when the history passes
  ``max_messages`` (200): the oldest ``len - max_messages + 20`` messages are folded into the long-term
  summary (extractive here: one line per pruned user message, recursively cut to a third when the summary
  passes ``max_summary_tokens``). Virtual trimming every turn when the remaining messages pass the budget:
  tier 3 = the newest ``full_recent_count`` (10) messages verbatim within 55% of the budget; tier 2 = the
  messages before them, condensed (reasoning dropped, tool output cut to 200 characters plus
  ``... (truncated)``), filled from the end back within 35%; tier 1 = the summary and topics as one system
  message after the system prompt, within 10%.

Both keep tool pairs valid: a kept window that would start with tool results takes back the assistant
message that called them (so the newest tool output is always sent), and an assistant message with tool
calls is never kept without its results (windows are suffixes of the history).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Strategy", "PassThrough", "SlidingWindow", "ThreeTier", "estimate_tokens", "message_chars", "STRATEGIES"]

Message = dict[str, Any]


class Strategy(Protocol):
    name: str

    def prepare(self, history: list[Message], budget: int) -> list[Message]: ...


def message_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def message_chars(message: Message) -> int:
    chars = len(message_text(message))
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {})
        chars += len(fn.get("name", "")) + len(fn.get("arguments", "") or "")
    return chars


def estimate_tokens(message: Message) -> int:
    """Seed 002's estimate: (runes + 3) / 4, the +3 standing for the role overhead."""
    return (message_chars(message) + 3) // 4


def _with_calls(kept: list[Message], dropped: list[Message]) -> list[Message]:
    """Keep tool pairs valid: a window that starts with tool results takes back the assistant message that
    called them (a few tokens), so the newest tool output is never dropped for lack of its call."""
    if not kept or kept[0].get("role") != "tool":
        return kept
    i = len(dropped) - 1
    while i >= 0 and dropped[i].get("role") == "tool":
        i -= 1
    if i >= 0 and dropped[i].get("tool_calls"):
        return dropped[i:] + kept
    start = 0  # no call to take back: drop the orphaned results
    while start < len(kept) and kept[start].get("role") == "tool":
        start += 1
    return kept[start:]


@dataclass
class PassThrough:
    name: str = "pass-through"

    def prepare(self, history: list[Message], budget: int) -> list[Message]:
        return list(history)


@dataclass
class SlidingWindow:
    name: str = "sliding window"
    max_chars_per_message: int = 4000

    def _truncate(self, message: Message) -> Message:
        text = message.get("content")
        if isinstance(text, str) and len(text) > self.max_chars_per_message:
            return {**message, "content": text[: self.max_chars_per_message]}
        return message

    def prepare(self, history: list[Message], budget: int) -> list[Message]:
        system = [m for m in history[:1] if m.get("role") == "system"]
        rest = [self._truncate(m) for m in history[len(system):]]
        used = sum(estimate_tokens(m) for m in system)
        kept: list[Message] = []
        for message in reversed(rest):
            cost = estimate_tokens(message)
            if used + cost > budget and kept:
                break
            used += cost
            kept.append(message)
        kept.reverse()
        return system + _with_calls(kept, rest[: len(rest) - len(kept)])


_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def condense(message: Message, tool_max: int = 200) -> Message:
    """Seed 003's condenser: drop reasoning, cut tool output to ``tool_max`` characters."""
    role = message.get("role")
    if role == "assistant":
        out = {k: v for k, v in message.items() if k not in ("reasoning_content", "reasoning", "thinking")}
        if isinstance(out.get("content"), str):
            out["content"] = _THINK.sub("", out["content"])
        return out
    if role == "tool":
        text = message_text(message)
        if len(text) > tool_max:
            return {**message, "content": text[:tool_max] + "... (truncated)"}
    return message


_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{3,}|[\u4e00-\u9fff]{2,4}")
_STOP = {"what", "that", "this", "with", "about", "there", "would", "could", "should", "your", "have", "more",
         "please", "remember", "later", "still", "unsure", "give", "three", "ideas", "explain", "detail", "next",
         "suggest", "think", "week", "common", "mistakes", "comes", "after", "continue", "summarise", "matters",
         "most", "advice", "earlier", "told"}


@dataclass
class ThreeTier:
    name: str = "three-tier"
    full_recent_count: int = 10
    condensed_tool_max: int = 200
    max_messages: int = 200
    prune_buffer: int = 20
    max_summary_tokens: int = 1000
    summary_lines: list[str] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)
    pruned: int = 0  # messages of the client history folded into the summary

    def _fold(self, messages: list[Message]) -> None:
        for m in messages:
            if m.get("role") != "user":
                continue
            text = re.sub(r"\[\[.*?\]\]", "", message_text(m)).strip()
            self.summary_lines.append("- " + text[:80])
            for word in _WORD.findall(text):
                key = word.lower()
                if key not in _STOP:
                    self.topics[key] = self.topics.get(key, 0) + 1
        while sum((len(line) + 3) // 4 for line in self.summary_lines) > self.max_summary_tokens:
            keep = max(1, len(self.summary_lines) // 3)  # "compress the old summary to a third"
            self.summary_lines = self.summary_lines[:keep // 2] + self.summary_lines[-(keep - keep // 2):]

    def _prune(self, history: list[Message], start: int) -> int:
        """Physical pruning: returns the new start of the live messages in ``history``."""
        live = len(history) - start
        if live <= self.max_messages:
            return start
        cut = start + live - self.max_messages + self.prune_buffer
        while cut < len(history) and history[cut].get("role") == "tool":  # never orphan tool results
            cut += 1
        self._fold(history[start:cut])
        return cut

    def _tier1(self, budget: int) -> list[Message]:
        if not self.summary_lines:
            return []
        topics = sorted(self.topics, key=lambda k: (-self.topics[k], k))[:12]
        text = ("[Conversation Summary]\n" + "\n".join(self.summary_lines) + "\n\n[Recallable Topics]: "
                + ", ".join(topics) + "\nUse the recall_memory tool to retrieve details about any topic above.")
        limit = int(0.10 * budget) * 4
        return [{"role": "system", "content": text[-limit:] if len(text) > limit else text}]

    def prepare(self, history: list[Message], budget: int) -> list[Message]:
        system = [m for m in history[:1] if m.get("role") == "system"]
        start = max(len(system), self.pruned)
        self.pruned = self._prune(history, start)
        live = history[self.pruned:]
        tier1 = self._tier1(budget)
        available = budget - sum(estimate_tokens(m) for m in system)
        if sum(estimate_tokens(m) for m in live) + sum(estimate_tokens(m) for m in tier1) <= available:
            return system + tier1 + live
        recent: list[Message] = []
        used = 0
        for m in reversed(live):
            cost = estimate_tokens(m)
            if len(recent) >= self.full_recent_count or (used + cost > 0.55 * available and recent):
                break
            recent.append(m)
            used += cost
        recent.reverse()
        middle: list[Message] = []
        used = 0
        for m in reversed(live[: len(live) - len(recent)]):
            c = condense(m, self.condensed_tool_max)
            cost = estimate_tokens(c)
            if used + cost > 0.35 * available:
                break
            middle.append(c)
            used += cost
        middle.reverse()
        before = live[: len(live) - len(recent) - len(middle)]
        window = _with_calls(middle + recent, [condense(m, self.condensed_tool_max) for m in before])
        return system + tier1 + window


STRATEGIES = {"pass-through": PassThrough, "sliding": SlidingWindow, "three-tier": ThreeTier}
