"""What the memory workers need to know, read from the proxy's settings (defaults when a setting is absent)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class MemoryConfig:
    max_summary_tokens: int = 1000  # B4 conversation summary; over it: re-compression (seed 003)
    batch_chars: int = 8000  # text of archived pages per summariser call
    message_chars: int = 600  # of one message, in a summariser prompt
    verbatim_days: int = 5  # seed 001: messages of the last N days stay verbatim
    history_soft_limit: int = 0  # stored messages per conversation; over it archived ones are pruned (0: never)
    history_hard_limit: int = 0  # over it after pruning: history_overflow event, forced archival (0: never)
    profile_max_facts: int = 30  # facts in the B2a profile
    topics_per_page: int = 6
    topics_per_conversation: int = 12
    sweep_interval_s: float = 600.0  # archival by age and due retries
    cache_ttl_s: float = 30.0  # latest_summary / latest_profile cache

    @classmethod
    def from_settings(cls, settings: Any) -> "MemoryConfig":
        values = {f.name: getattr(settings, f.name) for f in fields(cls) if hasattr(settings, f.name)}
        return cls(**values)
