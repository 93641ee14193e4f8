"""HTTP routes: chat completions, every other /v1 path, health, readiness, metrics."""

from __future__ import annotations

import time

from litestar import Request, Response, get, post, route

from memci_proxy.api.api_metrics import metered
from memci_proxy.api.auth import with_cache_salt
from memci_proxy.api.forwarding import respond, services_of
from memci_proxy.api.limits import admit_stream
from memci_proxy.turn.call import chat_call
from memci_proxy.turn.identity import pass_through_route_key, tenant_of
from memci_proxy.upstream.exchange import Outgoing
from memci_proxy.upstream.route_check import PATH as ROUTE_PATH
from memci_proxy.upstream.route_check import ready as route_ready
from memci_proxy.wire.errors import ProxyError
from memci_proxy.wire.unpaired import to_internal
from memci_proxy.wire.validate import parse_chat_body, parse_json_object, require_utf8, validate_chat_request

_FORWARD_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request) -> Response:
    """Errors are ProxyErrors, answered by the app's exception handler."""
    started = time.perf_counter()
    services = services_of(request)
    sent = await request.body()
    managed = services.context is not None
    body = to_internal(sent)  # lone surrogates as text the proxy can hold; the upstream gets them back as sent
    data, fields = parse_chat_body(body) if managed else (parse_json_object(body), None)
    validate_chat_request(data)
    limits = request.app.state.limits
    limits.check_messages(data)
    stream = data.get("stream") is True
    tenant = tenant_of(request.headers)
    if stream:
        await admit_stream(request.scope, limits, tenant)
    if not managed:
        body = sent  # forwarded as it came
    if services.settings.cache_salt_per_tenant:
        body, data = with_cache_salt(body, data, tenant)
    if managed:
        call = chat_call(request.headers, data, body, fields.get("messages") if fields else None, request.url.query,
                         started, tenant, user_secret=services.settings.user_hash_key)
        return respond(metered(await services.context.handle(call), services.metrics, "chat"))
    return respond(await services.exchange.send(Outgoing(
        "chat", "POST", "/chat/completions", request.url.query, request.headers, body, started, stream,
        route_key=pass_through_route_key(tenant, request.headers, data))))


@route("/v1/{path:path}", http_method=_FORWARD_METHODS, status_code=200)
async def forward_other(request: Request, path: str) -> Response:
    started = time.perf_counter()
    services = services_of(request)
    body = await request.body() if request.method in ("POST", "PUT", "PATCH", "DELETE") else None
    if body:
        require_utf8(body, request.headers.get("content-type", ""))
    if body and services.settings.cache_salt_per_tenant and request.method == "POST" and path.strip("/") in (
        "completions", "chat/completions"
    ):
        body, _ = with_cache_salt(body, parse_json_object(body), tenant_of(request.headers))
    stream = False
    if body and b'"stream"' in body:
        try:
            stream = parse_json_object(body).get("stream") is True
        except ProxyError:
            stream = False
    return respond(await services.exchange.send(Outgoing(
        "other", request.method, "/" + path.lstrip("/"), request.url.query, request.headers, body or None, started,
        stream, route_key=tenant_of(request.headers))))


@get("/health", sync_to_thread=False)
def health() -> dict[str, str]:
    return {"status": "ok"}


@get("/ready")
async def ready(request: Request) -> Response:
    services = services_of(request)
    checks: dict[str, dict[str, object]] = {}
    store = services.store
    if store is not None:
        checks["database"] = {"ok": await _safe(store.repo.ping()), "kind": store.kind_db}
        checks["hot_state"] = {"ok": await _safe(store.hot.ping()), "kind": store.kind_hot}
    else:
        checks["database"] = {"ok": True, "kind": "none (context management off)"}
    # The route chat uses, on every worker (memci_proxy.upstream.route_check: the check doctor runs too), cached briefly.
    verdicts = await services.route_watch.verdicts()
    checks["upstream"] = {"ok": route_ready(verdicts), "url": services.upstream.base_url(),
                          "route": services.upstream.base_url() + ROUTE_PATH,
                          **({"message": "; ".join(v.message for v in verdicts if not v.ok)}
                             if not all(v.ok for v in verdicts) else {})}
    embeddings = services.context.embeddings_status() if services.context is not None else None
    if embeddings is not None:
        checks["embeddings"] = embeddings
    ok = all(bool(c["ok"]) for c in checks.values())
    return Response(content={"status": "ready" if ok else "not ready", "checks": checks}, status_code=200 if ok else 503)


async def _safe(awaitable) -> bool:
    try:
        return bool(await awaitable)
    except Exception:
        return False


@get("/metrics", sync_to_thread=False)
def metrics(request: Request) -> Response:
    content, content_type = services_of(request).metrics.render()
    return Response(content=content, media_type=content_type)


ROUTES = [chat_completions, forward_other, health, ready, metrics]
