"""Metrics labelled by the client's API (memci_api_*): every API's answer is metered here in its chat-completions
form, before its codec translates it, so the three APIs are counted by one piece of code."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from proxy.metrics import Metrics
from proxy.upstream.exchange import Answer
from proxy.upstream.relay import usage_of_event, usage_of_json
from proxy.wire.chunks import aclose, usage_numbers

API_OF_PATH = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}


def api_failed(metrics: Metrics, path: str, status: int) -> None:
    """An error answered before a turn ran (a bad request, a busy conversation)."""
    api = API_OF_PATH.get(path)
    if api is not None:
        metrics.child(metrics.api_requests, api, str(status)).inc()


def metered(answer: Answer, metrics: Metrics, api: str, started: float) -> Answer:
    """The answer, counted by ``api``: its status, duration (a stream's at its last event) and usage."""
    metrics.child(metrics.api_requests, api, str(answer.status)).inc()
    if answer.events is None:
        metrics.child(metrics.api_request_duration, api).observe(time.perf_counter() - started)
        if answer.status == 200:
            _tokens(metrics, api, usage_of_json(answer.body))
        return answer
    answer.events = _metered_events(answer.events, metrics, api, started)
    return answer


async def _metered_events(events: AsyncIterator[bytes], metrics: Metrics, api: str, started: float
                          ) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            usage = usage_of_event(event)
            if usage is not None:
                _tokens(metrics, api, usage)
            yield event
    finally:
        metrics.child(metrics.api_request_duration, api).observe(time.perf_counter() - started)
        await aclose(events)


def _tokens(metrics: Metrics, api: str, usage: dict | None) -> None:
    if usage is None:
        return
    prompt, cached, _ = usage_numbers(usage)
    metrics.child(metrics.api_prompt_tokens, api).inc(prompt)
    metrics.child(metrics.api_cached_tokens, api).inc(cached)
