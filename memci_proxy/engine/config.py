"""The engine's own configuration, built from the proxy settings and the model's context window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .output_preview import OffloadLimits


# The contents page never takes more than this share of the prompt budget: everything after it is recomputed at
# an epoch, so a small contents page makes epochs cheap (measured: 0.951 -> 0.980 token-weighted cache hit rate
# on a 300-turn chat in an 8k window, loadtests/cache_bench.py).
CONTENTS_BUDGET_SHARE = 0.08
# A prompt over its budget (the fixed part and the newest turn alone pass it) still goes upstream while an answer of
# this many tokens (or the reserve, when smaller) fits beside it: a smaller answer rather than no answer.
MIN_ANSWER_TOKENS = 1024


@dataclass(frozen=True)
class EngineConfig:
    context_window: int = 32768
    output_reserve: int = 4096
    # The answer's reservation is at most this share of the window, whatever max_tokens the request asks: a request
    # asking more gets the window's rest after the prompt (`answer_tokens`), never a prompt squeezed to nothing.
    output_reserve_share: float = 0.25
    safety_margin: float = 0.10
    high_watermark: float = 0.95
    low_watermark: float = 0.40
    contents_max_tokens: int = 2048
    contents_budget_share: float = CONTENTS_BUDGET_SHARE
    evict_after_unrecalled: int = 200
    evict_after_unchanged: int = 400
    page_max_tokens: int = 4096
    page_budget_share: float = 1 / 6
    condense_tool_chars: int = 200
    summary_line_chars: int = 80
    cache_ttl: float = 300.0
    recall_enabled: bool = True
    recall_tool_name: str = "recall"
    # Active pages (newest first) kept verbatim when older active pages are condensed at an epoch.
    condense_keep_pages: int = 2
    # The cache counts as cold when the reported cached tokens fall below this fraction of the expected
    # stable prefix (and the expected prefix is at least `cold_cache_min_tokens`).
    cold_cache_ratio: float = 0.5
    cold_cache_min_tokens: int = 256
    # First-sight offload (memci_proxy.engine.output_preview): thresholds (0: never) and the preview's size, in tokens.
    offload: bool = True
    offload_tool_tokens: int = 2000
    offload_document_tokens: int = 8000
    offload_preview_tokens: int = 192
    offload_budget_share: float = 1 / 8

    @classmethod
    def from_settings(cls, settings: Any, context_window: int) -> "EngineConfig":
        """Read the context-engine fields of `memci_proxy.settings.Settings` (missing ones keep their defaults)."""
        mapping = {
            "output_reserve": "output_reserve",
            "output_reserve_share": "output_reserve_share",
            "safety_margin": "safety_margin",
            "high_watermark": "active_high_watermark",
            "low_watermark": "active_low_watermark",
            "contents_max_tokens": "contents_max_tokens",
            "evict_after_unrecalled": "evict_after_rounds_unrecalled",
            "evict_after_unchanged": "evict_after_rounds_unchanged",
            "page_max_tokens": "page_max_tokens",
            "condense_tool_chars": "condense_tool_chars",
            "summary_line_chars": "summary_line_chars",
            "cache_ttl": "cache_ttl",
            "recall_enabled": "recall_enabled",
            "recall_tool_name": "recall_tool_name",
            "condense_keep_pages": "condense_keep_pages",
            "cold_cache_ratio": "cold_cache_ratio",
            "cold_cache_min_tokens": "cold_cache_min_tokens",
            "offload": "offload",
            "offload_tool_tokens": "offload_tool_tokens",
            "offload_document_tokens": "offload_document_tokens",
            "offload_preview_tokens": "offload_preview_tokens",
        }
        values: dict[str, Any] = {"context_window": int(context_window)}
        for ours, theirs in mapping.items():
            if hasattr(settings, theirs):
                values[ours] = getattr(settings, theirs)
        return cls(**values)

    def contents_limit(self, budget: int) -> int:
        """Largest contents page: the setting, but never more than a quarter of the prompt budget."""
        return max(64, min(self.contents_max_tokens, int(self.contents_budget_share * budget)))

    def page_limit(self) -> int:
        """Largest page before continuation pages start: page_max_tokens, but never more than a sixth of the
        budget, so that an agent loop's closed pages can be archived long before its open page fills the window
        (the default 4,096 is 58% of an 8k window's budget)."""
        return max(256, min(self.page_max_tokens, int(self.budget(None) * self.page_budget_share)))

    def offload_limits(self) -> OffloadLimits:
        """A tool output over min(offload_tool_tokens, budget / 8) tokens is offloaded on arrival, a user message
        over min(offload_document_tokens, budget / 4); the preview takes offload_preview_tokens, at most half the
        tool threshold."""
        budget = self.budget(None)
        tool = min(self.offload_tool_tokens, max(64, int(budget * self.offload_budget_share)))
        document = min(self.offload_document_tokens, max(64, int(budget * 2 * self.offload_budget_share)))
        preview = max(32, min(self.offload_preview_tokens, tool // 2))
        return OffloadLimits(tool if self.offload_tool_tokens > 0 else 0,
                             document if self.offload_document_tokens > 0 else 0, preview)

    def reserve(self, max_tokens: int | None) -> int:
        """Tokens reserved for the answer: the request's max_tokens (else output_reserve), but never more than
        output_reserve_share of the window (Claude Code's 32,000 on a 32k window would leave the prompt nothing)."""
        wanted = self.output_reserve if max_tokens is None else max(0, int(max_tokens))
        return min(wanted, int(self.output_reserve_share * self.context_window))

    def margin(self) -> int:
        """Tokens of the window kept free for estimate errors."""
        return int(self.safety_margin * self.context_window)

    def budget(self, max_tokens: int | None) -> int:
        """Prompt budget (seed 003): window - answer reserve - safety margin; never below 1."""
        return max(1, self.context_window - self.reserve(max_tokens) - self.margin())

    def fits(self, prompt_tokens: int, max_tokens: int | None) -> bool:
        """Whether a prompt of ``prompt_tokens`` (upstream tokens, estimated) leaves room in the window for a minimal
        answer (MIN_ANSWER_TOKENS, or the reserve when smaller) beside half the safety margin, as ``answer_tokens``
        counts the answer's room: a prompt over the budget that still fits goes upstream with a smaller answer; one
        that does not is refused."""
        least = min(self.reserve(max_tokens), MIN_ANSWER_TOKENS)
        return prompt_tokens + self.margin() // 2 + least <= self.context_window

    def answer_tokens(self, max_tokens: int | None, prompt_tokens: int) -> int | None:
        """The max_tokens to send upstream for a prompt estimated at ``prompt_tokens`` (upstream tokens): the
        request's, lowered to what the window leaves after the prompt and half the safety margin (an engine such as
        vLLM or SGLang refuses prompt + max_tokens over its window). Half: the recall rounds may fill the other half
        (memci_proxy.turn.recall_rounds), so a prompt within the budget always leaves the reserve. None: the request sets
        none (the engine then answers up to the window's end). Never below 1."""
        if max_tokens is None:
            return None
        room = self.context_window - self.margin() // 2 - max(0, int(prompt_tokens))
        return max(1, min(int(max_tokens), room))
