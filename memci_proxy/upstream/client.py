"""The shared connection pool to the upstream OpenAI-compatible server(s)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import aiohttp

from memci_proxy.settings import Settings
from memci_proxy.upstream.routing import WorkerRouter
from memci_proxy.wire.errors import ProxyError, upstream_timeout, upstream_unreachable

# Headers that describe one hop, or that the proxy recomputes, never forwarded either way.
_HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "accept-encoding",
    }
)
_RESPONSE_DROP = _HOP_BY_HOP | {"content-encoding", "server", "date"}
# Headers the proxy itself adds to its upstream requests; a client's copy must not reach the upstream.
# The end user's id (and a bound key's hash of it) stays here.
_PROXY_OWNED = frozenset({"x-session-id", "x-memci-auth-tenant", "x-memci-auth-user", "x-memci-user"})
# Answers after which the same request is sent to the next worker (nothing reached the client yet; the
# worker did not run it): unavailable or overloaded. Other 5xx count toward down-marking and pass through.
_RETRY_ON_NEXT_WORKER = frozenset({502, 503})
_CONNECT_FAILURES = frozenset({"upstream_unreachable", "upstream_connect_timeout"})


class RoutedURL(str):
    """An upstream URL that remembers its routing key, so ``send`` can fail over to the next worker."""

    route_key: str | None
    suffix: str  # path and query, relative to the worker's base URL

    def __new__(cls, base: str, suffix: str, route_key: str | None) -> "RoutedURL":
        url = super().__new__(cls, base + suffix)
        url.route_key = route_key
        url.suffix = suffix
        return url


class UpstreamClient:
    """One aiohttp session (one pool) for every upstream request of this process."""

    def __init__(self, settings: Settings, registry=None) -> None:
        self.settings = settings
        self.base_urls = settings.upstream_urls
        self.router = WorkerRouter(
            self.base_urls, settings.upstream_down_after_errors, settings.upstream_down_seconds, registry
        )
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
        """The worker that serves this routing key now (rendezvous hashing, failed workers skipped)."""
        return self.router.candidates(route_key)[0]

    def url(self, path: str, query: str = "", route_key: str | None = None) -> str:
        """``path`` is relative to the OpenAI base URL, e.g. ``/chat/completions``."""
        suffix = f"{path}?{query}" if query else path
        return RoutedURL(self.base_url(route_key), suffix, route_key)

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

        Connection failures become 502 and time-outs 504, as OpenAI-style ProxyErrors. With several workers,
        a URL from ``url()`` that meets a connection failure or a 502/503 is sent to the next worker of its
        routing key (no byte has reached the client yet), and the failing worker is marked.
        """
        started = time.perf_counter()
        if not isinstance(url, RoutedURL):
            return await self._send_once(method, url, headers, body, started)
        workers = self.router.candidates(url.route_key)
        first = url[: len(url) - len(url.suffix)]
        if first in workers:  # the worker url() chose first, unless it was marked down since
            workers.remove(first)
            workers.insert(0, first)
        for i, worker in enumerate(workers):
            last = i == len(workers) - 1
            try:
                response, waited = await self._send_once(method, worker + url.suffix, headers, body, started)
            except ProxyError as exc:
                not_connected = exc.code in _CONNECT_FAILURES
                self.router.record(worker, "connect_error" if not_connected else "server_error")
                if last or not not_connected:
                    raise
                continue
            if response.status >= 500:
                self.router.record(worker, "server_error")
                if not last and response.status in _RETRY_ON_NEXT_WORKER:
                    response.release()
                    continue
            else:
                self.router.record(worker, "ok")
            return response, waited
        raise AssertionError("unreachable: the last worker returns or raises")

    async def _send_once(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, started: float
    ) -> tuple[aiohttp.ClientResponse, float]:
        try:
            response = await self.session.request(method, url, headers=headers, data=body, allow_redirects=False)
        except aiohttp.ConnectionTimeoutError as exc:
            raise ProxyError(504, f"upstream timed out connecting: {exc or type(exc).__name__}", "upstream_error",
                             "upstream_connect_timeout") from None
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
