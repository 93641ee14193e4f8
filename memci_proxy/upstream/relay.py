"""Relaying an upstream SSE stream to the client event by event, watching for usage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import aiohttp
import msgspec

from memci_proxy.wire.sse import DONE, SSESplitter, cut_stream_event, event_data

_decode = msgspec.json.Decoder().decode


def usage_of_json(data: bytes) -> dict | None:
    """The ``usage`` object of a completion or chunk (JSON bytes), if it carries one."""
    if b'"usage"' not in data:
        return None
    try:
        decoded = _decode(data)
    except msgspec.DecodeError:
        return None
    usage = decoded.get("usage") if isinstance(decoded, dict) else None
    return usage if isinstance(usage, dict) else None


def usage_of_event(event: bytes) -> dict | None:
    """The ``usage`` object of a chunk event, if it carries one."""
    if b'"usage"' not in event:
        return None
    data = event_data(event)
    return None if not data or data == b"[DONE]" else usage_of_json(data)


# The last event of the other APIs' streams (Responses, Anthropic Messages), which end without [DONE].
_LAST_EVENTS = (b"event: response.completed", b"event: response.failed", b"event: response.incomplete",
                b"event: message_stop", b"event: error")


async def relay_sse(
    response: aiohttp.ClientResponse,
    on_first_byte: Callable[[], None] | None = None,
    on_usage: Callable[[dict], None] | None = None,
    on_cut: Callable[[str], None] | None = None,
) -> AsyncIterator[bytes]:
    """Yield the upstream's events as they arrive, unchanged; close (cancel) the upstream request when the client
    leaves (the generator is closed early).

    A stream the upstream cuts before ``[DONE]`` ends with an OpenAI-style error event and ``[DONE]``, so the
    client sees an error rather than a silently short answer; ``on_cut(detail)`` is told (the exchange counts and
    logs it, memci_proxy.upstream.failures).
    """
    splitter = SSESplitter()
    saw_done = False
    first = True
    try:
        async for chunk in response.content.iter_any():
            if first:
                first = False
                if on_first_byte is not None:
                    on_first_byte()
            for event in splitter.feed(chunk):
                if (event.startswith(b"data: [DONE]") or event_data(event) == b"[DONE]"
                        or event.startswith(_LAST_EVENTS)):
                    saw_done = True
                elif on_usage is not None:
                    usage = usage_of_event(event)
                    if usage is not None:
                        on_usage(usage)
                yield event
        rest = splitter.rest()
        if rest.strip():
            yield rest if rest.endswith(b"\n\n") else rest + b"\n\n"
        if not saw_done:
            if on_cut is not None:
                on_cut("no [DONE] received")
            yield cut_stream_event("no [DONE] received")
            yield DONE
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # a cut body, a reset, a disconnect, a time-out
        # (memci_proxy.recall.tool.loop.stream_rounds reads the same exceptions as a cut)
        if on_cut is not None:
            on_cut(type(exc).__name__)
        yield cut_stream_event(type(exc).__name__)
        yield DONE
    finally:
        response.close()
