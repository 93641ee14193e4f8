"""The objects every route needs, built once per process in the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memci_proxy.metrics import Metrics
from memci_proxy.settings import Settings
from memci_proxy.upstream.client import UpstreamClient
from memci_proxy.upstream.exchange import Exchange
from memci_proxy.upstream.route_check import RouteWatch


@dataclass
class Services:
    settings: Settings
    metrics: Metrics
    upstream: UpstreamClient
    exchange: Exchange
    store: Any = None  # memci_proxy.store.factory.Store once opened
    context: Any = None  # memci_proxy.turn.service.TurnService when context management is on
    memory: Any = None  # memci_proxy.workers.runner.MemoryWorker when the memory workers run
    response_chain: Any = None  # memci_proxy.api.response_chain.ResponseChain, made on first use
    notes: dict[str, str] = field(default_factory=dict)  # what start-up chose (database, hot state)
    route_watch: RouteWatch | None = None  # does each upstream worker serve the chat route? (/ready, start-up)
