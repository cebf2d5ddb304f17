"""The api's ASGI app: `create_app(settings, clients=None)`.

The JSON API is under /api/v1 (its OpenAPI 3.1 document at /api/v1/openapi.json, browsable at
/api/v1/docs), the console under /console, and /healthz answers without a token. With `clients`
given (the service passes clients on its runtime's bus; tests pass their own) the app uses them;
without, its lifespan opens a bus connection of its own and closes it at the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import RedirectResponse

from vmsched.bus import connect
from vmsched.client import SchedulerClient
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.api import (
    error_map,
    routes_clusters,
    routes_decisions,
    routes_events,
    routes_policies,
    routes_simulate,
)
from vmsched_services.api.auth import TokenBook
from vmsched_services.api.console import console_router
from vmsched_services.api.deps import ApiState, Clients, Viewer
from vmsched_services.api.middleware import RequestGuard
from vmsched_services.api.models import ErrorResponse, Health, Whoami

API_PREFIX = "/api/v1"
TITLE = "vmsched HTTP API"
#: The errors every /api/v1 operation may answer, documented once for all of them.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "No token, or one the api does not know."},
    403: {"model": ErrorResponse, "description": "The token's role is too low (or a cookie request lacks its header)."},
    404: {"model": ErrorResponse, "description": "No such policy, cluster or decision."},
    409: {"model": ErrorResponse, "description": "A conflict: a locked policy, one still in use, a name taken."},
    413: {"model": ErrorResponse, "description": "The body is larger than VMSCHED_API_MAX_BODY_BYTES."},
    422: {"model": ErrorResponse, "description": "Bad input: every problem with its location."},
    503: {"model": ErrorResponse, "description": "A server or service is away: the hint says which; Retry-After."},
}


def open_clients(settings: Settings) -> tuple[Clients, Any]:
    """Clients on a bus of their own (not started), and that bus."""
    bus = connect(settings, "api")
    return Clients(SchedulerClient(settings, bus=bus), PolicyClient(settings, bus=bus)), bus


def api_router() -> APIRouter:
    """Every /api/v1 route."""
    router = APIRouter(prefix=API_PREFIX, responses=ERROR_RESPONSES)

    @router.get("/whoami", response_model=Whoami, tags=["identity"], summary="The token's name and role")
    async def whoami(who: Viewer) -> Whoami:
        return Whoami(name=who.name, role=who.role.label)

    for module in (routes_policies, routes_decisions, routes_clusters, routes_simulate, routes_events):
        router.include_router(module.router)
    return router


def create_app(settings: Settings, *, clients: Clients | None = None, tokens: TokenBook | None = None) -> FastAPI:
    """The app; `tokens` default to VMSCHED_API_TOKENS (the tokens file)."""
    book = tokens if tokens is not None else TokenBook.from_text(settings.api_tokens)
    # Given clients serve at once (an ASGI test client runs no lifespan); else the lifespan opens them.
    state = ApiState(settings=settings, tokens=book, clients=clients)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if clients is not None:
            yield
            return
        own, bus = open_clients(settings)
        await bus.start()
        state.clients = own
        try:
            yield
        finally:
            state.clients = None
            await bus.close()

    app = FastAPI(
        title=TITLE,
        version="1",
        description="Scheduling policies, cluster state, decisions, what-if and simulations over vmsched's bus "
        "(docs/http-api.md). Authenticate with `Authorization: Bearer <token>`.",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.api = state
    error_map.install(app)
    app.add_middleware(RequestGuard, max_body_bytes=settings.api_max_body_bytes)

    @app.get("/healthz", response_model=Health, tags=["health"], summary="The process answers (no token needed)")
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/console/")

    app.include_router(api_router())
    app.include_router(console_router())
    return app


__all__ = ["API_PREFIX", "create_app", "open_clients"]
