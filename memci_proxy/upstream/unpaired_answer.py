"""The upstream's answer to a body whose text the proxy holds in its internal form (memci_proxy.wire.unpaired): read in that
form too, so that a lone surrogate the upstream writes back (an echoed tool result) decodes like the client's did."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from memci_proxy.upstream.port import UpstreamResponse
from memci_proxy.wire.unpaired import to_internal


class _Lines:
    """The body's bytes as they arrive, rewritten a line at a time: an escape never spans a line (JSON strings hold
    no raw newline), so no escape is cut between two reads."""

    def __init__(self, content: Any) -> None:
        self._content = content

    async def iter_any(self) -> AsyncIterator[bytes]:
        rest = b""
        async for piece in self._content.iter_any():
            piece = rest + piece
            end = piece.rfind(b"\n") + 1
            rest = piece[end:]
            if end:
                yield to_internal(piece[:end])
        if rest:
            yield to_internal(rest)


class InternalTextResponse:
    """``response`` (an UpstreamResponse) with its body in the proxy's internal form."""

    def __init__(self, response: UpstreamResponse) -> None:
        self._response = response
        self.status: int = response.status
        self.headers: Mapping[str, str] = response.headers
        self.content = _Lines(response.content)

    async def read(self) -> bytes:
        return to_internal(await self._response.read())

    def release(self) -> None:
        self._response.release()

    def close(self) -> None:
        self._response.close()
