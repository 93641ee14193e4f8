"""The last upstream prompt of each recent conversation, for the admin prompt view and the memory workers' jobs (per
process, bounded)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memci_proxy.caches import BoundedLru
from memci_proxy.turn.answer_room import requested_tokens
from memci_proxy.turn.turn import Turn
from memci_proxy.workers.prefix import SummaryBase


@dataclass
class LastPrompt:
    messages: list[dict[str, Any]]
    blocks: list[Any]
    epoch: bool
    at: float
    size: int  # bytes of the prompt as encoded for the upstream
    body: dict[str, Any] | None = None  # the first round's body as sent (its messages are ``messages``)
    # estimated tokens: shed by this turn's epoch, prefilled after the stable prefix, pushed by proactive recall
    accounting: dict[str, int] = field(default_factory=dict)
    auth: str = field(default="", repr=False)  # the Authorization the upstream got with it (the memory jobs resend it)


class LastPrompts(BoundedLru[str, LastPrompt]):
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        super().__init__("last_prompts", max_entries, max_bytes, lambda _cid, p: p.size + 256)

    def remember(self, turn: Turn, body: dict[str, Any], size: int, memory: Any, routed: Callable[[str], str],
                 pushed: list[dict[str, Any]] | None = None) -> None:
        """This turn's prompt (as sent: a pushed recall round included) becomes the conversation's last one. At an
        epoch that archives pages, the one it replaces is the last prompt that held them: the memory workers' jobs
        (``memory``) send it again to the upstream worker ``routed`` names (whose cache holds its prefix)."""
        p, cid = turn.plan, turn.conversation_id
        if p.archived and memory is not None:
            before = self.get(cid)
            if before is not None and before.body is not None:
                memory.keep_base(turn.call.tenant, cid, SummaryBase(before.body, routed(cid), before.at, before.size,
                                                                    auth=before.auth))
        messages, blocks = p.messages, list(p.blocks)
        if pushed:
            messages = [*messages, *pushed]
            blocks.append(("push", len(p.messages), len(messages)))
        accounting = {**turn.accounting, "tokens_pushed": turn.pushed_tokens}
        asked = requested_tokens(turn.call.data)
        if asked is not None:  # the answer's room: asked, and sent (lowered to fit the window)
            accounting.update(max_tokens_asked=asked, max_tokens_sent=requested_tokens(body) or asked)
        headers = turn.call.headers
        auth = headers.get("authorization") or headers.get("Authorization") or ""
        self.put(cid, LastPrompt(messages, blocks, p.epoch, time.time(), size, body, accounting, auth))
