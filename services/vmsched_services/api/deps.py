"""The FastAPI dependencies every route (the JSON API's and the console's) uses.

    principal(Role.VIEWER)   -> a Depends: the caller (Principal: name, role, via), or 401 / 403
    clients                  -> the dependency giving the bus clients (Clients: scheduler, policies)
    api_state                -> the dependency giving the app's ApiState (settings, tokens, clients)
    Viewer, Operator, Admin  -> Annotated[Principal, principal(...)] for each role
    ClientsDep               -> Annotated[Clients, Depends(clients)]

    @router.get("/thing")
    async def thing(who: Operator, cl: ClientsDep) -> ...
    # or: who: Annotated[Principal, principal(Role.OPERATOR)]

A caller presents its token as `Authorization: Bearer <token>`, or as the console's session cookie
`vmsched_session` (HttpOnly, SameSite=Strict; `set_session_cookie` sets it). A request authenticated
by the cookie with an unsafe method (POST, PUT, PATCH, DELETE) must also carry `X-Vmsched-Console: 1`:
a form on another site can make a browser send the cookie, but not that header (CSRF defence).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer

from vmsched.client import SchedulerClient
from vmsched.errors import BusUnavailable, NotAuthenticated, NotAuthorized
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.api.auth import Role, TokenBook

#: The console's session cookie: the same token as the bearer one.
SESSION_COOKIE = "vmsched_session"
#: The header a cookie-authenticated unsafe request must carry, with the value "1".
CONSOLE_HEADER = "X-Vmsched-Console"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
NO_TOKENS_HINT = (
    "the api has no tokens: set VMSCHED_API_TOKENS_FILE to a tokens file "
    "(`vmsched api token add NAME --role admin --file FILE` makes one) and restart it"
)
BEARER_HINT = "send `Authorization: Bearer <token>`; `vmsched api token add` makes a token"


@dataclass(frozen=True)
class Clients:
    """The bus clients the routes call (on the api's one bus connection)."""

    scheduler: SchedulerClient
    policies: PolicyClient


@dataclass
class ApiState:
    """What the app holds: its settings, the tokens it accepts, and its clients once the bus is open."""

    settings: Settings
    tokens: TokenBook
    clients: Clients | None = None


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name (the audit log's "on behalf of") and role."""

    name: str
    role: Role
    #: "bearer" or "cookie": how the token came.
    via: str


def api_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def clients(request: Request) -> Clients:
    """The bus clients; 503 (BusUnavailable) while the app has none (starting, stopping)."""
    found = api_state(request).clients
    if found is None:
        raise BusUnavailable("the api is not connected to the bus yet", hint="try again in a few seconds")
    return found


_bearer = HTTPBearer(auto_error=False, description="A token from the api's tokens file (VMSCHED_API_TOKENS_FILE).")
_cookie = APIKeyCookie(name=SESSION_COOKIE, auto_error=False, description="The console's session: the same token.")


def authenticate(
    request: Request, bearer: HTTPAuthorizationCredentials | None, cookie: str | None, required: Role
) -> Principal:
    """The caller of `request` if it may act as `required`; else NotAuthenticated (401) or NotAuthorized (403)."""
    tokens = api_state(request).tokens
    if not tokens:
        raise NotAuthenticated("this api accepts no token yet", hint=NO_TOKENS_HINT)
    if bearer is not None:
        token, via = bearer.credentials, "bearer"
    elif cookie:
        token, via = cookie, "cookie"
    else:
        raise NotAuthenticated("no token: the request carries no Authorization header", hint=BEARER_HINT)
    entry = tokens.find(token)
    if entry is None:
        raise NotAuthenticated("the token is not one this api knows", hint=BEARER_HINT)
    if via == "cookie" and request.method not in SAFE_METHODS and request.headers.get(CONSOLE_HEADER) != "1":
        raise NotAuthorized(
            f"a {request.method} with the session cookie needs the header {CONSOLE_HEADER}: 1 (cross-site requests "
            "cannot send it)",
            hint="the console sends it; other clients send Authorization: Bearer <token>",
        )
    if entry.role < required:
        raise NotAuthorized(
            f"token {entry.name} has the role {entry.role.label}; this needs {required.label}",
            hint=f"use a token with the role {required.label} or higher",
        )
    return Principal(entry.name, entry.role, via)


def principal(required: Role) -> Any:
    """A dependency (`who: Principal = principal(Role.ADMIN)`): the caller, at least `required`."""

    def check(
        request: Request,
        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        cookie: Annotated[str | None, Depends(_cookie)],
    ) -> Principal:
        return authenticate(request, bearer, cookie, required)

    return Depends(check)


Viewer = Annotated[Principal, principal(Role.VIEWER)]
Operator = Annotated[Principal, principal(Role.OPERATOR)]
Admin = Annotated[Principal, principal(Role.ADMIN)]
ClientsDep = Annotated[Clients, Depends(clients)]


def set_session_cookie(response: Response, request: Request, token: str, *, max_age: int | None = None) -> None:
    """Put `token` in the console's session cookie: HttpOnly, SameSite=Strict, Secure over https."""
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )


def clear_session_cookie(response: Response) -> None:
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")


__all__ = [
    "CONSOLE_HEADER",
    "SESSION_COOKIE",
    "Admin",
    "ApiState",
    "Clients",
    "ClientsDep",
    "Operator",
    "Principal",
    "Role",
    "Viewer",
    "api_state",
    "authenticate",
    "clear_session_cookie",
    "clients",
    "principal",
    "set_session_cookie",
]
