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
    page_instruction(template, pages)         -> the instruction naming the pages
    is_job_body(body)                         -> whether an upstream body is a memory job (benchmarks)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.recall.pagetext import message_text

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


def job_body(base: dict[str, Any], instruction: str, max_tokens: int) -> dict[str, Any]:
    """The base body with one user message appended (the base's messages kept as the same objects, so they encode
    to the same bytes), not streamed, one choice, ``max_tokens`` and temperature 0. A tool_choice that forces a call
    becomes "auto" (the tools stay in the prompt: dropping them, or "none" on some servers, would change the
    rendered prefix)."""
    body = {k: v for k, v in base.items() if k not in _DROPPED}
    body["messages"] = [*base.get("messages", ()), {"role": "user", "content": instruction}]
    body["max_tokens"] = max(8, int(max_tokens))
    body["temperature"] = 0
    body["stream"] = False
    choice = base.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        body["tool_choice"] = "auto"
    return body


def _key(message: dict[str, Any]) -> str:
    """A message as a base holds it: a tool result by its call id (a prompt may carry it whole, as the preview of an
    offloaded output, or condensed), any other message by its text."""
    call_id = message.get("tool_call_id") if message.get("role") == "tool" else None
    return f"tool result {call_id}" if isinstance(call_id, str) and call_id else message_text(message)


def covers(base_messages: Sequence[dict[str, Any]], page_messages: Sequence[dict[str, Any]]) -> bool:
    """The base holds the page: its first and last messages appear in the base, in that order (the active pages of
    a prompt are the stored messages verbatim)."""
    if not page_messages:
        return False
    keys = [_key(m) for m in base_messages]
    first, last = _key(page_messages[0]), _key(page_messages[-1])
    try:
        start = keys.index(first)
    except ValueError:
        return False
    return last in keys[start:]


def _quote(message: dict[str, Any]) -> str:
    text = " ".join(str(message_text(message).split(": ", 1)[-1]).split())
    text = text[:QUOTE_CHARS].replace('"', "'")
    return text


def page_instruction(template: str, first: dict[str, Any], last: dict[str, Any]) -> str:
    """The instruction naming a run of pages by the beginnings of its first and last messages."""
    return template.format(first=_quote(first), last=_quote(last))


def is_job_body(body: Any) -> bool:
    """An upstream request body made by the memory workers (prefix jobs and the plain summariser calls)."""
    from proxy.workers.summarizer import WORKER_PROMPTS

    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    last = messages[-1].get("content")
    if isinstance(last, str) and last.startswith(JOB_MARKER):
        return True
    first = messages[0].get("content") if isinstance(messages[0], dict) else None
    return messages[0].get("role") == "system" and isinstance(first, str) and any(
        first.startswith(p.split("{", 1)[0]) for p in WORKER_PROMPTS)
