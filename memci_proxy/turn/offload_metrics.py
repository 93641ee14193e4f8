"""The metrics of first-sight offload (memci_proxy.engine.output_preview) for one planned turn."""

from __future__ import annotations

from memci_proxy.engine import Plan
from memci_proxy.engine.offload_state import find_offload
from memci_proxy.metrics import Metrics


def count_offloads(metrics: Metrics, plan: Plan) -> None:
    """Outputs offloaded by the plan, by kind, and the tokens their previews saved on arrival."""
    if not plan.offloaded:
        return
    for label in plan.offloaded:
        record = find_offload(plan.state, label)
        metrics.child(metrics.offloaded_outputs, record.kind if record is not None else "tool").inc()
    metrics.offload_tokens_saved.inc(plan.offload_tokens_saved)
