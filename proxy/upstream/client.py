"""The shared connection pool to the upstream OpenAI-compatible server(s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp

from proxy.settings import Settings
from proxy.wire.errors import ProxyError, upstream_timeout, upstream_unreachable

# Headers that describe one hop, or that the proxy recomputes, never forwarded either way.
_HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding",
    }
)
_RESPONSE_DROP = _HOP_BY_HOP | {"content-encoding", "server", "date"}
# Headers the proxy itself adds to its upstream requests; a client's copy must not reach the upstream.
_PROXY_OWNED = frozenset({"x-session-id"})


class UpstreamClient:
    """One aiohttp session (one pool) for every upstream request of this process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.base_urls = settings.upstream_urls
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=settings.upstream_connect_timeout, sock_read=settings.upstream_read_timeout
        )

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.settings.upstream_max_connections, limit_per_host=0, ttl_dns_cache=300,
                enable_cleanup_closed=True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("upstream client not started")
        return self._session

    def base_url(self, route_key: str | None = None) -> str:
        return self.base_urls[0]

    def url(self, path: str, query: str = "", route_key: str | None = None) -> str:
        """``path`` is relative to the OpenAI base URL, e.g. ``/chat/completions``."""
        url = self.base_url(route_key) + path
        return f"{url}?{query}" if query else url

    def forward_headers(self, incoming: Mapping[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in incoming.items():
            lower = name.lower()
            if lower in _HOP_BY_HOP or lower in _PROXY_OWNED:
                continue
            out[name] = value
        if self.settings.upstream_api_key:
            for name in [n for n in out if n.lower() == "authorization"]:
                del out[name]
            out["Authorization"] = f"Bearer {self.settings.upstream_api_key}"
        return out

    async def send(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> tuple[aiohttp.ClientResponse, float]:
        """Send a request; return the response (headers read) and the seconds until they came.

        Connection failures become 502 and time-outs 504, as OpenAI-style ProxyErrors.
        """
        started = time.perf_counter()
        try:
            response = await self.session.request(method, url, headers=headers, data=body, allow_redirects=False)
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as exc:
            raise upstream_timeout(str(exc) or type(exc).__name__) from None
        except aiohttp.ClientConnectorError as exc:
            raise upstream_unreachable(str(exc)) from None
        except aiohttp.ClientError as exc:
            raise upstream_unreachable(f"{type(exc).__name__}: {exc}") from None
        return response, time.perf_counter() - started

    async def read_body(self, response: aiohttp.ClientResponse) -> bytes:
        try:
            return await response.read()
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as exc:
            raise upstream_timeout(str(exc) or "reading the body") from None
        except aiohttp.ClientError as exc:
            raise ProxyError(502, f"upstream closed the connection: {exc}", "upstream_error", "upstream_cut") from None
        finally:
            response.release()


def response_headers(upstream: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in upstream.items() if k.lower() not in _RESPONSE_DROP}
