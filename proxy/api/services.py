"""The objects every route needs, built once per process in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.metrics import Metrics
from proxy.settings import Settings
from proxy.upstream.client import UpstreamClient


@dataclass
class Services:
    settings: Settings
    metrics: Metrics
    upstream: UpstreamClient
    store: Any = None  # proxy.store.factory.Store once opened
    context: Any = None  # proxy.context.ContextService when context management is on
    memory: Any = None  # proxy.workers.runner.MemoryWorker when the memory workers run
    notes: dict[str, str] = field(default_factory=dict)  # what start-up chose (database, hot state)
