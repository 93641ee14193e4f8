"""What the memory workers need to know, read from the proxy's settings (defaults when a setting is absent)."""

from __future__ import annotations

from dataclasses import dataclass
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
    wait_s: float = 10.0  # an epoch waits this long at most for the previous epoch's jobs (memci_proxy.workers.covering)
    idle_s: float = 0.0  # 0: summary jobs right after the epoch; else once the conversation had no turn this long
    bases_max_entries: int = 1000  # conversations whose pre-epoch prompt is kept for prefix jobs
    bases_max_mb: int = 64  # memory bound of those prompts
    prefix_jobs: bool = True  # jobs on the kept prompts (off when the summariser is another server: no shared cache)

    @classmethod
    def from_settings(cls, settings: Any) -> "MemoryConfig":
        values = {field: getattr(settings, name) for field, name in SETTING_NAMES.items() if hasattr(settings, name)}
        if values.get("idle_s", 0.0) > 0:  # the previous epoch's jobs wait for a quiet moment: no epoch waits for them
            values["wait_s"] = 0.0
        return cls(**values, prefix_jobs=not getattr(settings, "summary_model_url", ""))


# MemoryConfig field -> name of the proxy setting (env MEMCI_<NAME upper>) that sets it.
SETTING_NAMES = {
    "max_summary_tokens": "max_summary_tokens",
    "verbatim_days": "archive_verbatim_days",
    "history_soft_limit": "history_soft_limit",
    "history_hard_limit": "history_hard_limit",
    "profile_max_facts": "profile_max_facts",
    "sweep_interval_s": "memory_sweep_interval_s",
    "cache_ttl_s": "summary_cache_ttl_s",
    "idle_s": "summary_idle_s",
    "wait_s": "summary_wait_s",
    "bases_max_entries": "last_prompts_max_entries",
    "bases_max_mb": "last_prompts_max_mb",
}
