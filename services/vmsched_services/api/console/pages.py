"""Rendering the console's pages: the Jinja2 environment, the session check, static assets."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from vmsched_services.api.console.session import SESSION_COOKIE, load_initial, who_is

HERE = Path(__file__).parent
STATIC = HERE / "static"

#: Content types of the assets the console ships (anything else is not served).
_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}

#: Pages run only the console's own scripts and styles, and talk only to their own origin: a
#: value that slipped through escaping still could not load or send anything elsewhere.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

NAV = (("clusters", "Clusters", "/console/clusters"), ("policies", "Policies", "/console/policies"),
       ("whatif", "What-if", "/console/whatif"), ("simulation", "Simulation", "/console/simulation"))  # fmt: skip


@cache
def _assets() -> dict[str, tuple[bytes, str, str]]:
    """name -> (content, content type, short hash for cache busting), read once."""
    found: dict[str, tuple[bytes, str, str]] = {}
    for path in sorted(STATIC.iterdir()):
        kind = _TYPES.get(path.suffix)
        if kind is not None and path.is_file():
            body = path.read_bytes()
            found[path.name] = (body, kind, hashlib.sha256(body).hexdigest()[:10])
    return found


def static_url(name: str) -> str:
    asset = _assets().get(name)
    return f"/console/static/{name}" + (f"?v={asset[2]}" if asset else "")


def static_response(name: str) -> Response:
    """One of the console's assets (by exact file name: no paths), cacheable since its URL carries its hash."""
    asset = _assets().get(name)
    if asset is None:
        return Response("not found", status_code=404, media_type="text/plain")
    body, kind, _ = asset
    return Response(body, media_type=kind, headers={"Cache-Control": "public, max-age=3600", **_SAFE})


_SAFE = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name: data is always escaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(static=static_url, nav_items=NAV)
    return env


def html(template: str, context: dict[str, Any], status_code: int = 200) -> HTMLResponse:
    body = environment().get_template(template).render(**context)
    return HTMLResponse(
        body,
        status_code=status_code,
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store", **_SAFE},
    )


def safe_next(target: str) -> str:
    """Where to go after signing in: only a console page of this site (no open redirect)."""
    if target.startswith("/console/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/console/clusters"


def session_token(request: Request) -> str | None:
    return request.cookies.get(SESSION_COOKIE) or None


def login_redirect(request: Request) -> Response:
    """To the login page, coming back here afterwards."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/console/login?next={quote(target, safe='')}", status_code=303)


def login_page(request: Request, *, next_url: str, error: str = "", status_code: int = 200) -> HTMLResponse:
    return html(
        "login.html",
        {
            "title": "Sign in",
            "nav": "",
            "who": None,
            "next_url": next_url,
            "error": error,
            "initial": None,
            "problem": None,
            "page": "login",
        },
        status_code=status_code,
    )


async def render(request: Request, template: str, *, nav: str, title: str, load: str, **params: str) -> Response:
    """A page for the signed-in user, with the data it starts from; to the login page without a valid session."""
    token = session_token(request)
    principal = await who_is(request, token) if token else None
    if principal is None:
        response = login_redirect(request)
        if token:
            response.delete_cookie(SESSION_COOKIE, path="/")
        return response
    initial, problem = await load_initial(request, load, params)
    context = {
        "title": title,
        "nav": nav,
        "who": principal,
        "params": params,
        "page": load,
        "initial": {"page": load, "params": params, "who": principal, "data": initial},
        "problem": problem,
    }
    return html(template, context)


__all__ = ["SESSION_COOKIE", "login_page", "login_redirect", "render", "safe_next", "session_token", "static_response"]
