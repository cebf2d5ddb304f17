"""The web console: server-rendered pages with a little plain JavaScript, served by the api service.

Every page is a Jinja2 template (autoescaped) over `base.html`, with the data it starts from
embedded as JSON (`<script type="application/json" id="initial">`, which the browser never runs);
the page's script (static/, plain JavaScript, no build step, nothing from a CDN) draws it and then
keeps it fresh through the same JSON API under /api/v1 that integrators use, authenticated by the
`vmsched_session` cookie the login page sets. The console holds no data and has no write path of
its own: everything it changes goes through the API, so the API's roles and audit apply.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from vmsched_services.api.console.pages import (
    SESSION_COOKIE,
    login_page,
    render,
    safe_next,
    static_response,
)
from vmsched_services.api.console.session import who_is

#: How long the session cookie lives; the token itself may expire earlier (the API then answers 401
#: and the console sends the user back to the login page).
SESSION_MAX_AGE_S = 12 * 3600


def console_router() -> APIRouter:
    """The console's pages (under /console) and its static assets (/console/static/...)."""
    router = APIRouter(prefix="/console", include_in_schema=False)
    _session_routes(router)
    _page_routes(router)
    return router


def _session_routes(router: APIRouter) -> None:
    """Signing in and out, the home redirect, the assets."""

    @router.get("")
    @router.get("/")
    async def home() -> Response:
        return RedirectResponse("/console/clusters", status_code=303)

    @router.get("/static/{name}")
    async def static(name: str) -> Response:
        return static_response(name)

    @router.get("/login")
    async def login_form(request: Request, next: str = "/console/clusters", error: str = "") -> Response:
        return login_page(request, next_url=safe_next(next), error=error)

    @router.post("/login")
    async def login(request: Request) -> Response:
        # Parsed by hand: a form of one field does not need python-multipart.
        form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
        token = (form.get("token") or [""])[0].strip()
        next_url = safe_next((form.get("next") or ["/console/clusters"])[0])
        if not _same_origin(request):
            return login_page(request, next_url=next_url, error="This form must be sent from the console itself.")
        if not token:
            return login_page(request, next_url=next_url, error="Paste an API token to sign in.")
        principal = await who_is(request, token)
        if principal is None:
            return login_page(
                request,
                next_url=next_url,
                error="That token is not valid. Ask an administrator for a token from the API's tokens file.",
            )  # 200: the form again, with why (a 401 would read as a failed resource in the browser's console)
        response = RedirectResponse(next_url, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            token,
            max_age=SESSION_MAX_AGE_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        response = RedirectResponse("/console/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return response


def _page_routes(router: APIRouter) -> None:
    """The pages, each rendered with the data it starts from."""

    @router.get("/clusters")
    async def clusters(request: Request) -> Response:
        return await render(request, "clusters.html", nav="clusters", title="Clusters", load="clusters")

    @router.get("/clusters/{cluster_id}")
    async def cluster(request: Request, cluster_id: str) -> Response:
        return await render(
            request,
            "cluster.html",
            nav="clusters",
            title=f"Cluster {cluster_id}",
            load="cluster",
            cluster_id=cluster_id,
        )

    @router.get("/clusters/{cluster_id}/decisions/{request_id}")
    async def decision(request: Request, cluster_id: str, request_id: str) -> Response:
        return await render(
            request,
            "decision.html",
            nav="clusters",
            title=f"Decision {request_id}",
            load="decision",
            cluster_id=cluster_id,
            request_id=request_id,
        )

    @router.get("/policies")
    async def policies(request: Request) -> Response:
        return await render(request, "policies.html", nav="policies", title="Scheduling policies", load="policies")

    @router.get("/policies/{name}")
    async def policy(request: Request, name: str) -> Response:
        return await render(request, "policy.html", nav="policies", title=f"Policy {name}", load="policy", name=name)

    @router.get("/whatif")
    async def whatif(request: Request, cluster: str = "") -> Response:
        return await render(request, "whatif.html", nav="whatif", title="What if", load="whatif", cluster_id=cluster)

    @router.get("/simulation")
    async def simulation(request: Request) -> Response:
        return await render(request, "simulation.html", nav="simulation", title="Simulation", load="simulation")


def _same_origin(request: Request) -> bool:
    """A login form posted from another site is refused (login CSRF): browsers send Origin on POST."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return origin == f"{request.url.scheme}://{request.url.netloc}"


__all__ = ["SESSION_COOKIE", "console_router"]
