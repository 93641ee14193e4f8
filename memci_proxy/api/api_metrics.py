"""Token metrics labelled by the client's API (memci_api_prompt_tokens_total, memci_api_cached_tokens_total): every
API's answer is metered here in its chat-completions form, before its codec translates it, so the three APIs are
counted by one piece of code. Requests, their statuses and durations are counted at the edge
(memci_proxy.api.request_metrics)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from memci_proxy.metrics import Metrics
from memci_proxy.upstream.exchange import Answer
from memci_proxy.upstream.relay import usage_of_event, usage_of_json
from memci_proxy.wire.chunks import aclose, usage_numbers

API_OF_PATH = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}


def metered(answer: Answer, metrics: Metrics, api: str) -> Answer:
    """The answer, its usage counted by ``api`` (a stream's as its usage event passes)."""
    if answer.events is None:
        if answer.status == 200:
            _tokens(metrics, api, usage_of_json(answer.body))
        return answer
    answer.events = _metered_events(answer.events, metrics, api)
    return answer


async def _metered_events(events: AsyncIterator[bytes], metrics: Metrics, api: str) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            usage = usage_of_event(event)
            if usage is not None:
                _tokens(metrics, api, usage)
            yield event
    finally:
        await aclose(events)


def _tokens(metrics: Metrics, api: str, usage: dict | None) -> None:
    if usage is None:
        return
    prompt, cached, _ = usage_numbers(usage)
    metrics.child(metrics.api_prompt_tokens, api).inc(prompt)
    metrics.child(metrics.api_cached_tokens, api).inc(cached)
