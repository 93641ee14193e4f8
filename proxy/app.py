"""Composition root: builds the Litestar app and wires the adapters in its lifespan."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware

from proxy.api.admin import ADMIN_ROUTES
from proxy.api.auth import AuthMiddleware, Authenticator
from proxy.api.limits import Limits, LimitsMiddleware
from proxy.api.conversations import CONVERSATION_ROUTES
from proxy.api.routes import ROUTES
from proxy.api.rewrite import REWRITE_ROUTES
from proxy.api.search import SEARCH_ROUTES
from proxy.api.services import Services
from proxy.metrics import Metrics
from proxy.settings import Settings, load_settings
from proxy.upstream.client import UpstreamClient
from proxy.wire.errors import from_status

log = logging.getLogger("memci")


def _http_error(request: Request, exc: HTTPException) -> Response:
    err = from_status(exc.status_code, str(exc.detail))
    return Response(content=err.body(), status_code=err.status, media_type="application/json", headers=exc.headers)


def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    err = from_status(500, f"internal proxy error: {type(exc).__name__}")
    return Response(content=err.body(), status_code=500, media_type="application/json")


def create_app(settings: Settings | None = None) -> Litestar:
    settings = settings or load_settings()
    metrics = Metrics()
    services = Services(settings=settings, metrics=metrics, upstream=UpstreamClient(settings, metrics.registry))
    authenticator = Authenticator(settings)  # a bad virtual_keys setting fails here, at start
    limits = Limits(settings, metrics.registry)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        await services.upstream.start()
        try:
            if settings.manage_context:
                from proxy.context.service import start_context  # imported here: pass-through needs none of it

                await start_context(services)
                from proxy.workers.wiring import start_memory_worker

                await start_memory_worker(services)
            else:
                log.info("context management off: pure pass-through to %s", settings.upstream_url)
            yield
        finally:
            if services.memory is not None:
                await services.memory.stop()
            if services.context is not None:
                await services.context.close()
            if services.store is not None:
                await services.store.close()
            await services.upstream.close()
            await limits.close()

    app = Litestar(
        route_handlers=[*ROUTES, *ADMIN_ROUTES, *SEARCH_ROUTES, *REWRITE_ROUTES, *CONVERSATION_ROUTES],
        lifespan=[lifespan],
        # Auth first: it decides the tenant the limits and every handler use.
        middleware=[DefineMiddleware(AuthMiddleware, authenticator=authenticator),
                    DefineMiddleware(LimitsMiddleware, limits=limits)],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        request_max_body_size=settings.max_body_bytes,
        openapi_config=None,
        debug=False,
    )
    app.state.services = services
    app.state.limits = limits
    return app


def create_app_from_env() -> Litestar:
    """Factory for the ASGI server: settings come from the environment the CLI prepared."""
    logging.basicConfig(level=load_settings().log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return create_app()
