"""Does the upstream serve the route chat will use? The one check behind `/ready`, `doctor` and the start-up warning.

The probe is ``POST {base}/chat/completions`` with the body ``{"messages": null}``: any OpenAI-compatible server
rejects it at once (400/422, 500 from llama-cpp-python's validation, or 401 without a key) without generating
anything (an empty body ``{}`` is not enough: llama-cpp-python's server takes it for an empty conversation and
generates, taking its one cache slot from the live conversation), while a base URL that misses the API's prefix (``/v1``)
answers 404 or 405. The verdict and its message come from ``judge`` (one place); ``check`` sends the probe through
the proxy's own upstream client (``/ready``, start-up), doctor sends it with its own HTTP client and judges it here.

``RouteWatch`` keeps the last verdict per base URL for ``ttl_s`` seconds, so that `/ready`, which load balancers
poll, costs one small upstream request per worker every ``ttl_s`` seconds at most.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from memci_proxy.upstream.port import Upstream
from memci_proxy.wire.errors import ProxyError

PATH = "/chat/completions"
BODY = b'{"messages": null}'
HEADERS = {"Content-Type": "application/json"}
TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class RouteCheck:
    base_url: str
    ok: bool
    reachable: bool
    message: str
    status: int | None = None


def judge(base_url: str, status: int, body: bytes = b"") -> RouteCheck:
    """The verdict on the probe's answer."""
    if status in (404, 405) and not _names_a_model(body):
        hint = ""
        path = urlsplit(base_url).path.rstrip("/")
        if not path.endswith("/v1"):
            hint = f" — did you mean {base_url.rstrip('/')}/v1?"
        return RouteCheck(base_url, False, True, f"the upstream has no {PATH} under {base_url} (HTTP {status}){hint}",
                          status)
    if status in (502, 503, 504):  # unavailable (another 5xx to an empty body says nothing of the route)
        return RouteCheck(base_url, False, True, f"the upstream's {PATH} under {base_url} answers HTTP {status}", status)
    return RouteCheck(base_url, True, True, f"{base_url}{PATH} answers (HTTP {status} to a request without messages)", status)


def unreachable(base_url: str, detail: str) -> RouteCheck:
    return RouteCheck(base_url, False, False, f"the upstream {base_url} is unreachable: {detail}")


def _names_a_model(body: bytes) -> bool:
    """A 404 that is about the model (vLLM: "The model `x` does not exist"): the route is there."""
    return b"model" in body.lower()


async def check(client: Upstream, base_url: str) -> RouteCheck:
    """Probe one worker through the proxy's upstream client (its key, its time-outs)."""
    try:
        response, _ = await client.send("POST", base_url + PATH, client.forward_headers(HEADERS), BODY)
    except ProxyError as exc:
        return unreachable(base_url, exc.message)
    try:
        body = await response.read() if response.status in (404, 405) else b""
    except Exception:  # the status decides; an unreadable body names no model
        body = b""
    finally:
        response.release()
    return judge(base_url, response.status, body)


class RouteWatch:
    """The verdicts of every upstream worker, each checked at most every ``ttl_s`` seconds."""

    def __init__(self, client: Upstream, base_urls: list[str], ttl_s: float = TTL_S) -> None:
        self.client = client
        self.base_urls = list(base_urls)
        self.ttl_s = ttl_s
        self._last: dict[str, tuple[float, RouteCheck]] = {}
        self._lock = asyncio.Lock()

    async def verdicts(self) -> list[RouteCheck]:
        async with self._lock:  # concurrent polls share one probe
            now = time.monotonic()
            stale = [u for u in self.base_urls if u not in self._last or now - self._last[u][0] >= self.ttl_s]
            if stale:
                fresh = await asyncio.gather(*(check(self.client, u) for u in stale))
                for result in fresh:
                    self._last[result.base_url] = (time.monotonic(), result)
            return [self._last[u][1] for u in self.base_urls]


def ready(verdicts: list[RouteCheck]) -> bool:
    """Ready: no worker lacks the route (a configuration error), and at least one serves it (the others may be down:
    requests fail over to the workers that answer)."""
    return any(v.ok for v in verdicts) and not any(v.reachable and not v.ok and v.status in (404, 405)
                                                      for v in verdicts)
