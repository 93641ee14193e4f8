"""Composition root: builds the Litestar app and wires the adapters in its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware

from memci_proxy.api.admin import ADMIN_ROUTES
from memci_proxy.api.auth import AuthMiddleware, Authenticator
from memci_proxy.api.error_shapes import error_body_for
from memci_proxy.api.keys import KEY_ROUTES
from memci_proxy.api.limits import Limits, LimitsMiddleware
from memci_proxy.confusables import install as install_look_alikes
from memci_proxy.api.conversations import CONVERSATION_ROUTES
from memci_proxy.api.users import USER_ROUTES
from memci_proxy.api.messages import MESSAGES_ROUTES
from memci_proxy.api.responses import RESPONSES_ROUTES
from memci_proxy.api.routes import ROUTES
from memci_proxy.api.request_metrics import RequestMetricsMiddleware
from memci_proxy.api.rewrite import REWRITE_ROUTES
from memci_proxy.api.search import SEARCH_ROUTES
from memci_proxy.api.services import Services
from memci_proxy.log_redaction import install_log_redaction
from memci_proxy.log_setup import configure_logging
from memci_proxy.metrics import Metrics
from memci_proxy.settings import Settings, load_settings
from memci_proxy.upstream.client import UpstreamClient
from memci_proxy.upstream.exchange import Exchange
from memci_proxy.upstream.route_check import RouteWatch
from memci_proxy.wire import logtext
from memci_proxy.wire.errors import ProxyError, from_status

log = logging.getLogger("memci")


def _proxy_error(request: Request, exc: ProxyError) -> Response:
    """Every ProxyError a handler raises: its body in the shape of the route's API (counted by
    memci_proxy.api.request_metrics)."""
    return Response(content=error_body_for(request.url.path, exc), status_code=exc.status,
                    media_type="application/json", headers=exc.headers or None)


def _http_error(request: Request, exc: HTTPException) -> Response:
    """Litestar's own errors (413 for a body over max_body_bytes, 404, 405): in the shape of the path's API."""
    err = from_status(exc.status_code, str(exc.detail))
    return Response(content=error_body_for(request.url.path, err), status_code=err.status,
                    media_type="application/json", headers=exc.headers)


def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", logtext.field(request.method, 16), logtext.field(request.url.path))
    err = from_status(500, f"internal proxy error: {type(exc).__name__}")
    return Response(content=error_body_for(request.url.path, err), status_code=500, media_type="application/json")


def tune_garbage_collector(gen0_threshold: int) -> None:
    """Everything built at start-up (modules, clients, the store) moves out of the collector's sight, and young
    objects are collected less often: a request allocates thousands of short-lived objects (decoded messages), and
    Python's default threshold (700) runs a collection several times per request."""
    if gen0_threshold <= 0:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0_threshold, 20, 20)


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or load_settings()
    install_look_alikes()  # the engine's markup escaping folds Unicode confusables (memci_proxy.confusables)
    metrics = Metrics()
    upstream = UpstreamClient(settings, metrics.registry)
    services = Services(settings=settings, metrics=metrics, upstream=upstream, exchange=Exchange(upstream, metrics),
                        route_watch=RouteWatch(upstream, settings.upstream_urls))
    authenticator = Authenticator(settings)  # a bad virtual_keys setting fails here, at start
    limits = Limits(settings, metrics.registry)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await services.upstream.start()
        # The upstream's route, checked while the rest starts: a warning, never a failed start.
        upstream_check = asyncio.create_task(warn_about_the_upstream(services.route_watch))
        announce: asyncio.Task[None] | None = None  # the `ready on` line, once ready (announce_ready)
        try:
            if settings.manage_context:
                from memci_proxy.turn.service import start_turn_service  # imported here: pass-through needs none of it
                from memci_proxy.workers.wiring import start_memory_worker

                services.context = await start_turn_service(settings, metrics, services.exchange)
                services.store = services.context.store
                services.notes["database"] = services.store.kind_db
                services.notes["hot_state"] = services.store.kind_hot
                # Virtual keys from PostgreSQL from now on (memci_proxy.keys), changes announced through Redis.
                from memci_proxy.store.sql.key_queries import SqlKeyRepository

                await authenticator.attach(SqlKeyRepository(services.store.engine), settings.redis_url)
                await start_memory_worker(services)
                services.context.memory = services.memory
            else:
                log.info("context management off: pure pass-through to %s", settings.upstream_url)
            tune_garbage_collector(settings.gc_gen0_threshold)
            announce = asyncio.create_task(announce_ready(services, listening_url(settings.host, settings.port)))
            yield
        finally:
            for task in (upstream_check, announce):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await authenticator.keys.close()
            if services.memory is not None:
                await services.memory.stop()
            if services.response_chain is not None:
                await services.response_chain.flush()  # the Responses answers' chains still being written
            if services.context is not None:
                await services.context.close()
            if services.store is not None:
                await services.store.close()
            await services.upstream.close()
            await limits.close()

    app = Litestar(
        route_handlers=[*ROUTES, *RESPONSES_ROUTES, *MESSAGES_ROUTES, *ADMIN_ROUTES, *SEARCH_ROUTES, *REWRITE_ROUTES,
                        *CONVERSATION_ROUTES, *USER_ROUTES, *KEY_ROUTES],
        lifespan=[lifespan],
        # Metrics outermost (every answer counted once, whoever gave it); then auth: it decides the tenant the
        # limits and every handler use.
        middleware=[DefineMiddleware(RequestMetricsMiddleware, metrics=metrics),
                    DefineMiddleware(AuthMiddleware, authenticator=authenticator),
                    DefineMiddleware(LimitsMiddleware, limits=limits)],
        exception_handlers={ProxyError: _proxy_error, HTTPException: _http_error, Exception: _internal_error},
        request_max_body_size=settings.max_body_bytes,
        openapi_config=None,
        logging_config=None,  # logging is configured once, with its redaction filter (create_app_from_env)
        debug=False,
    )
    app.state.services = services
    app.state.limits = limits
    app.state.authenticator = authenticator  # the keys admin API (memci_proxy.api.keys)
    return app


async def announce_ready(services: Services, url: str, poll: float = 0.05) -> None:
    """``ready on <url>`` once what /ready checks of the proxy itself is ready: the packaged embedding model, which
    loads in the background after the start, no longer loading (loaded, or failed for good: search is lexical). The
    upstream is not waited for: when it does not serve chat the start warns (warn_about_the_upstream)."""
    status = services.context.embeddings_status if services.context is not None else None
    while status is not None and (state := status()) is not None and not state["ok"]:
        await asyncio.sleep(poll)
    log.info("ready on %s", url)


def listening_url(host: str, port: int) -> str:
    if host in ("", "0.0.0.0", "::"):
        return f"http://127.0.0.1:{port} (listening on all interfaces)"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def warn_about_the_upstream(watch: RouteWatch) -> None:
    """One WARNING per upstream worker that does not serve the chat route at start (unreachable, or a base URL
    without its /v1); the proxy serves anyway and `/ready` says not ready until it does."""
    try:
        verdicts = await watch.verdicts()
    except Exception as exc:  # a warning helper never stops the start
        log.warning("could not check the upstream at start: %s: %s", type(exc).__name__, exc)
        return
    for verdict in verdicts:
        if not verdict.ok:
            log.warning("%s (the proxy runs; /ready says not ready while no upstream serves chat)", verdict.message)


def create_app_from_env() -> Litestar:
    """Factory for the ASGI server: settings come from the environment the CLI prepared."""
    settings = load_settings()
    configure_logging(settings.log_level)  # initdb and migration output only at debug (memci_proxy.log_setup)
    install_log_redaction(settings)  # no key reaches a log line (memci_proxy.log_redaction)
    return create_app(settings)
