"""The metrics reference, generated from the metrics the proxy registers.

    memci-proxy metrics --markdown > docs/metrics.md        # tests/unit/test_docs_generated.py checks it

The table lists every metric of `memci_proxy.metrics.Metrics`, of the limits (`memci_proxy.api.limits.Limits`) and of the
upstream worker router, with its type, labels and help text.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

COMMAND = "memci-proxy metrics --markdown > docs/metrics.md"

_INTRO = f"""# Metrics

<!-- Generated from the proxy's metric definitions by `{COMMAND}`: edit the help texts there. -->

`GET /metrics` (Prometheus text format) on the proxy's own port. Counters carry the `_total` suffix when scraped,
histograms `_bucket`, `_sum` and `_count`.

The upstream's prefix-cache hit rate, token-weighted:
`rate(memci_upstream_cached_tokens_total[5m]) / rate(memci_upstream_prompt_tokens_total[5m])`
(recording rules in `prometheus-rules.yml`; a Grafana dashboard, `grafana/dashboards/memci.json`; both are in the
repository's `config/` directory, which `compose.yaml` mounts, and in the wheel under `memci_proxy/_data/config/`).
"""


def registry_of_the_proxy() -> CollectorRegistry:
    """A registry holding every metric family the proxy process registers."""
    from memci_proxy.api.limits import Limits
    from memci_proxy.metrics import Metrics
    from memci_proxy.settings import Settings
    from memci_proxy.upstream.routing import WorkerRouter

    registry = CollectorRegistry()
    Metrics(registry)
    Limits(Settings(), registry)
    WorkerRouter(["http://a/v1", "http://b/v1"], registry=registry)
    return registry


def metric_rows(registry: CollectorRegistry) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(exposed name, type, label names, help) of every metric in the registry, in registration order."""
    rows = []
    seen = set()
    for collector in list(registry._collector_to_names):  # noqa: SLF001 - prometheus_client keeps no public list
        name = getattr(collector, "_name", None)
        if name is None and hasattr(collector, "describe"):  # a custom collector (memci_proxy.caches.CacheCollector)
            for family in collector.describe():
                if family.name not in seen:
                    seen.add(family.name)
                    shown = family.name + "_total" if family.type == "counter" else family.name
                    rows.append((shown, family.type, tuple(getattr(family, "_labelnames", ())), family.documentation))
            continue
        if name is None or name in seen:
            continue
        seen.add(name)
        kind = getattr(collector, "_type", "untyped")
        shown = name + "_total" if kind == "counter" else name
        labels: Any = getattr(collector, "_labelnames", ())
        rows.append((shown, kind, tuple(labels), getattr(collector, "_documentation", "")))
    return rows


def markdown() -> str:
    lines = [_INTRO, "| metric | type | labels | meaning |", "| --- | --- | --- | --- |"]
    for name, kind, labels, doc in metric_rows(registry_of_the_proxy()):
        label_text = ", ".join(f"`{label}`" for label in labels)
        lines.append(f"| `{name}` | {kind} | {label_text} | {doc.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
