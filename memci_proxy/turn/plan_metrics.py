"""A plan's metrics (memci_proxy.metrics): the tokens it estimates, reuses, saves and sheds, its epoch, archived pages,
evictions and offloads; and the turn's accounting of them (kept with its last prompt, shown by the admin API)."""

from __future__ import annotations

import math

from memci_proxy.engine import ConversationState, Plan
from memci_proxy.metrics import Metrics
from memci_proxy.turn.offload_metrics import count_offloads


def count_plan(m: Metrics, p: Plan, before: ConversationState | None) -> dict[str, int]:
    """Metrics of a plan; returns its accounting (estimated upstream tokens): shed by an epoch, prefilled after
    the stable prefix."""
    ratio = max(0.0, float(p.state.correction_ratio or 1.0))
    prefilled = max(0, p.estimated_tokens - math.ceil(p.state.expected_cached_tokens * ratio))
    shed = 0
    if p.epoch:
        held = 0 if before is None else before.system_tokens + before.active_tokens
        held += sum(t for _, _, _, t in p.new_entries) - p.offload_tokens_saved
        shed = max(0, math.ceil((held - p.state.system_tokens - p.state.active_tokens) * ratio))
        m.epoch_tokens_shed.observe(shed)
        m.epoch_tokens_prefilled.observe(prefilled)
    m.estimated_prompt_tokens.inc(p.estimated_tokens)
    m.prefix_reuse_tokens.inc(getattr(p, "stable_prefix_tokens", 0) or 0)
    saved = getattr(p, "tokens_saved", 0) or 0
    if saved > 0:
        m.tokens_saved.inc(saved)
    if p.epoch:
        m.epochs.labels(p.epoch_reason or "unknown").inc()
    if p.archived:
        m.pages_archived.inc(len(p.archived))
    count_offloads(m, p)
    for _, rule in p.evicted:
        m.evictions.labels(rule).inc()
    return {"tokens_shed": shed, "tokens_prefilled": prefilled}
