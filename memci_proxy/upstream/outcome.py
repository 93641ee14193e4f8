"""How the request being answered ended, as the upstream exchange saw it: set when a stream the client already
receives (status 200 sent) fails, read by the edge that counts each request once (memci_proxy.api.request_metrics)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class Outcome:
    stream_failed: bool = False


_current: ContextVar[Outcome | None] = ContextVar("memci_request_outcome", default=None)


def begin() -> Outcome:
    """A fresh outcome for the request now starting (in its task: the handler and its stream share it)."""
    outcome = Outcome()
    _current.set(outcome)
    return outcome


def stream_failed() -> None:
    """The stream being relayed ended with an upstream failure (an error event instead of its end)."""
    outcome = _current.get()
    if outcome is not None:
        outcome.stream_failed = True
