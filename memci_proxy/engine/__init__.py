"""The context engine: pages, contents page, eviction, budget, layout, condensing. Pure (no I/O, no clock).

Entry points: `plan` per request, `observe_usage` after the upstream answered, `add_hidden` and
`record_recall` for resolved recall exchanges. See DESIGN.md sections 4 and 5.
"""

from .config import EngineConfig
from .contents import render_contents, summary_line
from .condense import condense_message
from .feedback import add_hidden, observe_usage, record_recall
from .fingerprint import chain_hashes, entry_hash, entry_hashes
from .layout import VOLATILE_CLOSE, VOLATILE_OPEN, volatile_block
from .planner import EPOCH_COLD_CACHE, EPOCH_HIGH_WATERMARK, Plan, TurnInput, plan, split_leading_system
from .state import (
    ACTIVE,
    ARCHIVED,
    EVICTED,
    ConversationState,
    HiddenGroup,
    PageRecord,
    archived_pages,
    common_prefix_len,
    evicted_pages,
    normalise_label,
    page_entry_range,
    page_hidden_messages,
    page_table,
)
from .tokens import EstimateCounter, TokenCounter, TokenizersCounter, make_counter

__all__ = [
    "ACTIVE",
    "ARCHIVED",
    "EVICTED",
    "EPOCH_COLD_CACHE",
    "EPOCH_HIGH_WATERMARK",
    "VOLATILE_CLOSE",
    "VOLATILE_OPEN",
    "ConversationState",
    "EngineConfig",
    "EstimateCounter",
    "HiddenGroup",
    "PageRecord",
    "Plan",
    "TokenCounter",
    "TokenizersCounter",
    "TurnInput",
    "add_hidden",
    "archived_pages",
    "chain_hashes",
    "common_prefix_len",
    "condense_message",
    "entry_hash",
    "entry_hashes",
    "evicted_pages",
    "make_counter",
    "normalise_label",
    "observe_usage",
    "page_entry_range",
    "page_hidden_messages",
    "page_table",
    "plan",
    "record_recall",
    "render_contents",
    "split_leading_system",
    "summary_line",
    "volatile_block",
]
