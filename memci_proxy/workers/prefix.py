"""Summary jobs on the conversation's cached prefix.

At a compaction epoch the oldest active pages leave the prompt. The last upstream prompt that still held them is
the one sent just before that epoch (the epoch's own prompt, and every later one, no longer does). The proxy keeps
that prompt as a ``SummaryBase``; a summary (or profile) job for those pages then sends it again byte for byte
(same messages, tools, model and every field that shapes the rendered prompt, such as ``cache_salt`` or
``chat_template_kwargs``) plus ONE user message at the end, the instruction. The upstream's prefix cache covers
everything but the instruction.

Pure helpers, no I/O:
    job_body(base, instruction, max_tokens)   -> the request body of the job
    covers(base_messages, page_messages)      -> whether a base still holds a page
    SummaryBase.holds(page_messages)          -> the same, on the base's key index (built once per base)
    page_instruction(template, pages)         -> the instruction naming the pages
    is_job_body(body)                         -> whether an upstream body is a memory job (benchmarks)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memci_proxy.engine.layout import without_memory_block
from memci_proxy.recall.reading.pagetext import message_text

# Fields of the client's request that shape the answer's delivery or decoding, not the rendered prompt: the job sets
# or drops them. Everything else (model, messages, tools, tool_choice unless it forces a call, cache_salt,
# chat_template_kwargs, reasoning_effort, ...) is kept as sent, so that the prompt renders to the same tokens.
_DROPPED = ("stream_options", "max_completion_tokens", "logprobs", "top_logprobs", "response_format", "n", "stop",
            "prediction", "audio", "modalities", "logit_bias", "seed", "stream")

SUMMARY_INSTRUCTION = (
    "Memory note (not a question to answer): summarise the part of the conversation above that starts at the "
    "message beginning \"{first}\" and ends with the message beginning \"{last}\", in a few sentences: decisions, "
    "facts, open questions and names that later turns may need. Reply with the summary only; do not call tools."
)
PROFILE_INSTRUCTION = (
    "Memory note (not a question to answer): from the part of the conversation above that starts at the message "
    "beginning \"{first}\" and ends with the message beginning \"{last}\", list stable facts about the user that "
    "stay true across conversations (name, role, preferences, languages, projects, environment). One fact per line, "
    "each starting with '- '. Reply NONE when there is none; do not call tools."
)
JOB_MARKER = "Memory note (not a question to answer):"
QUOTE_CHARS = 60


@dataclass(frozen=True)
class SummaryBase:
    """The last upstream prompt that held some pages: the body as sent (first round), the upstream base URL the
    conversation is routed to, and when it was sent (epoch seconds)."""

    body: dict[str, Any]
    base_url: str
    at: float
    size: int = 0  # bytes of the body as encoded (for the memory bound)
    # the Authorization the upstream got with it (the client's key passed through, or its virtual key's upstream
    # key): the jobs resend the prompt as that request did (kept in memory only, never stored or logged)
    auth: str = field(default="", repr=False)
    # digest of each message key -> (first, last) position: filled by the first ``holds``, so that every job and
    # page of the epoch asks a dictionary instead of re-rendering the whole prompt (the contents page included)
    _positions: dict[bytes, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    def holds(self, page_messages: Sequence[dict[str, Any]]) -> bool:
        """``covers(self.body["messages"], page_messages)``, or the page goes on past this very prompt
        (``continuation``): an epoch soon after the base's turn archived the page that turn opened."""
        return held(self._keys(), page_messages) or self.continuation(page_messages) is not None

    def continuation(self, page_messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """The page's messages after this prompt's last one, when the page holds that message, the prompt holds
        the page up to it, and what follows is plain text ending with an answer (none of it in the prompt). A job
        then sends the base and those messages: the answer to the base's own turn (the upstream generated it on the
        base: its prefix is cached, its own tokens mostly too); on a replica that kept the prompt of the turn before
        (the last turn went to another replica), that turn's question and answer too: the same instruction, about
        the same pages, as one proxy would send. Never further (a base kept epochs ago would make a prompt longer
        than any the conversation sent, over the window)."""
        messages = self.body.get("messages") or ()
        if len(page_messages) < 2 or not messages or page_messages[-1].get("role") != "assistant":
            return None
        keys, last = self._keys(), _digest(messages[-1])
        end = next((i for i in range(len(page_messages) - 2, -1, -1) if _digest(page_messages[i]) == last), None)
        if end is None or not held(keys, page_messages[:end + 1]):
            return None
        after = list(page_messages[end + 1:])
        if any(_digest(m) in keys or not _plain(m) for m in after) or sum(m.get("role") == "user" for m in after) > 1:
            return None  # at most the turn after the base's: a prompt at most one turn longer than one sent
        return after

    def answer_after(self, page_messages: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        """The page's last message when it alone is the ``continuation``: the answer to this prompt."""
        after = self.continuation(page_messages)
        return after[0] if after is not None and len(after) == 1 else None

    def _keys(self) -> dict[bytes, tuple[int, int]]:
        if not self._positions:
            self._positions.update(key_positions(self.body.get("messages") or ()))
        return self._positions


def _plain(message: dict[str, Any]) -> bool:
    return (message.get("role") in ("user", "assistant") and isinstance(message.get("content"), str)
            and not message.get("tool_calls"))


def job_body(base: dict[str, Any], instruction: str, max_tokens: int,
             answer: dict[str, Any] | Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The base body with one user message appended (the base's messages kept as the same objects, so they encode
    to the same bytes), after the messages that continue the base when given (SummaryBase.continuation: the
    ``answer`` the upstream gave to the base, a message or a list), not streamed, one choice, ``max_tokens`` and temperature 0. A tool_choice that forces a call becomes "auto"
    (the tools stay in the prompt: dropping them, or "none" on some servers, would change the rendered prefix)."""
    body = {k: v for k, v in base.items() if k not in _DROPPED}
    after = [] if answer is None else [answer] if isinstance(answer, dict) else list(answer)
    answered = [{"role": m.get("role"), "content": m.get("content") or ""} for m in after]
    body["messages"] = [*base.get("messages", ()), *answered, {"role": "user", "content": instruction}]
    body["max_tokens"] = max(8, int(max_tokens))
    body["temperature"] = 0
    body["stream"] = False
    choice = base.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        body["tool_choice"] = "auto"
    return body


def _key(message: dict[str, Any]) -> str:
    """A message as a base holds it: a tool result by its call id (a prompt may carry it whole, as the preview of an
    offloaded output, or condensed), any other message by its text (the first active message's without the memory
    block that leads it)."""
    call_id = message.get("tool_call_id") if message.get("role") == "tool" else None
    if isinstance(call_id, str) and call_id:
        return f"tool result {call_id}"
    return message_text(without_memory_block(message))


def _digest(message: dict[str, Any]) -> bytes:
    return hashlib.blake2b(_key(message).encode("utf-8", "surrogatepass"), digest_size=16).digest()


def key_positions(base_messages: Sequence[dict[str, Any]]) -> dict[bytes, tuple[int, int]]:
    """Each message key of a base (as a digest) with the first and the last position it holds."""
    out: dict[bytes, tuple[int, int]] = {}
    for i, message in enumerate(base_messages):
        key = _digest(message)
        seen = out.get(key)
        out[key] = (i, i) if seen is None else (seen[0], i)
    return out


def held(positions: dict[bytes, tuple[int, int]], page_messages: Sequence[dict[str, Any]]) -> bool:
    """The base of ``positions`` holds the page: its first message appears in it, and its last one there or after."""
    if not page_messages:
        return False
    first = positions.get(_digest(page_messages[0]))
    if first is None:
        return False
    last = positions.get(_digest(page_messages[-1]))
    return last is not None and last[1] >= first[0]


def covers(base_messages: Sequence[dict[str, Any]], page_messages: Sequence[dict[str, Any]]) -> bool:
    """The base holds the page: its first and last messages appear in the base, in that order (the active pages of
    a prompt are the stored messages verbatim)."""
    return held(key_positions(base_messages), page_messages)


def _quote(message: dict[str, Any]) -> str:
    text = " ".join(str(message_text(message).split(": ", 1)[-1]).split())
    text = text[:QUOTE_CHARS].replace('"', "'")
    return text


def page_instruction(template: str, first: dict[str, Any], last: dict[str, Any]) -> str:
    """The instruction naming a run of pages by the beginnings of its first and last messages."""
    return template.format(first=_quote(first), last=_quote(last))


def is_job_body(body: Any) -> bool:
    """An upstream request body made by the memory workers (prefix jobs and the plain summariser calls)."""
    from memci_proxy.workers.summarizer import WORKER_PROMPTS

    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    last = messages[-1].get("content")
    if isinstance(last, str) and last.startswith(JOB_MARKER):
        return True
    first = messages[0].get("content") if isinstance(messages[0], dict) else None
    return messages[0].get("role") == "system" and isinstance(first, str) and any(
        first.startswith(p.split("{", 1)[0]) for p in WORKER_PROMPTS)
