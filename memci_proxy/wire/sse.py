"""Server-sent events: split a byte stream into events, and encode events (a cut stream's error event too)."""

from __future__ import annotations

from memci_proxy.wire.errors import error_body

DONE = b"data: [DONE]\n\n"


class SSESplitter:
    """Incremental splitter: feed bytes, get back complete raw events (each ending with a blank line)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r\n" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            events.append(buf[start : end + 2])
            start = end + 2
        self._buf = buf[start:]
        return events

    def rest(self) -> bytes:
        """Bytes left over at the end of the stream (an unterminated event)."""
        rest, self._buf = self._buf, b""
        return rest


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` payload of a raw event, or None if it has none (comments, keep-alives)."""
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            parts.append(value)
    if not parts:
        return None
    return b"\n".join(parts)


def encode_data(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def cut_stream_event(detail: str) -> bytes:
    """The error event that ends a stream the upstream cut short (the relay's and the recall loop's)."""
    return encode_data(error_body(f"upstream stream ended early: {detail}", "upstream_error", "upstream_cut"))
