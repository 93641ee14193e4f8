"""What the upstream exchange needs from a connection to the upstream: the port UpstreamClient implements (aiohttp),
and tests implement in-process (over httpx.MockTransport)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol


class ResponseBody(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive."""


class UpstreamResponse(Protocol):
    """An upstream answer whose status and headers have arrived (aiohttp.ClientResponse's shape)."""

    status: int
    headers: Mapping[str, str]
    content: ResponseBody

    async def read(self) -> bytes: ...

    def release(self) -> None: ...

    def close(self) -> None:
        """Close the connection: an unfinished upstream request is cancelled."""


class Upstream(Protocol):
    def url(self, path: str, query: str = "", route_key: str | None = None) -> str:
        """The URL of ``path`` (relative to the OpenAI base URL) on the worker that serves ``route_key``."""

    def forward_headers(self, incoming: Mapping[str, str]) -> dict[str, str]:
        """The client's headers as the upstream gets them (hop-by-hop and proxy-owned ones dropped)."""

    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
                   ) -> tuple[UpstreamResponse, float]:
        """The response with its headers read, and the seconds until they came. Raises ProxyError (502/504)."""

    async def read_body(self, response: Any) -> bytes:
        """The whole body, the response released. Raises ProxyError on a cut or a time-out."""
