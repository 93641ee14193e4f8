"""The last upstream prompt of each recent conversation, for the admin prompt view (per process, bounded)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memci_proxy.caches import BoundedLru


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
