"""Who the console's user is, and the data a page starts from, both through the API's own code.

The console authenticates exactly as the JSON API does (the same tokens file, the same roles): a
token pasted on the login page becomes the `vmsched_session` cookie, which the API accepts like a
bearer token. A page's initial data comes from the same clients and route functions the JSON
routes answer with, in the same JSON shapes. When getting it fails (a service away, an unknown
cluster) the page still renders, with the error as a banner (message and hint, never a
traceback), and its script fetches again through the JSON API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder

from vmsched.errors import VmschedError
from vmsched_services.api import routes_policies
from vmsched_services.api.deps import SESSION_COOKIE, ApiState, Clients, Principal
from vmsched_services.api.error_map import of_vmsched_error

#: How long a page waits for its initial data before rendering without it (its script then
#: fetches it, and shows the error if the service stays away): a page never hangs on the bus.
LOAD_TIMEOUT_S = 4.0

Problem = dict[str, str]


def _state(request: Request) -> ApiState | None:
    found = getattr(request.app.state, "api", None)
    return found if isinstance(found, ApiState) else None


def principal_of(request: Request, token: str | None) -> Principal | None:
    """The token's holder as the API sees it (the same tokens file), or None when it is not valid."""
    state = _state(request)
    if not token or state is None or not state.tokens:
        return None
    entry = state.tokens.find(token)
    return None if entry is None else Principal(entry.name, entry.role, "cookie")


async def who_is(request: Request, token: str | None) -> dict[str, str] | None:
    """{name, role} of the token's holder, or None when the token is not valid."""
    found = principal_of(request, token)
    return None if found is None else {"name": found.name, "role": found.role.label}


def _problem(exc: VmschedError) -> Problem:
    _, body = of_vmsched_error(exc)
    error = body["error"]
    return {"message": str(error["message"]), "hint": str(error.get("hint") or "")}


async def _loads(parts: dict[str, Callable[[], Awaitable[Any]]]) -> tuple[dict[str, Any], Problem | None]:
    """Each part's JSON (None when it failed or took too long) and the first problem met."""
    out: dict[str, Any] = {}
    problem: Problem | None = None

    async def one(key: str, get: Callable[[], Awaitable[Any]]) -> None:
        nonlocal problem
        try:
            async with asyncio.timeout(LOAD_TIMEOUT_S):
                out[key] = jsonable_encoder(await get())
        except VmschedError as exc:
            out[key] = None
            problem = problem or _problem(exc)
        except TimeoutError:
            out[key] = None

    await asyncio.gather(*(one(k, g) for k, g in parts.items()))
    return out, problem


def _parts(page: str, params: dict[str, str], who: Principal, cl: Clients) -> dict[str, Callable[[], Awaitable[Any]]]:
    s = cl.scheduler
    cid = params.get("cluster_id", "")
    match page:
        case "clusters":
            return {"clusters": s.clusters}
        case "cluster":
            return {
                "state": lambda: s.state(cid),
                "decisions": lambda: s.recent_decisions(cid, 25),
            }  # HA runs a check: the page asks for it itself, not to hold its first paint
        case "decision":
            return {"decision": lambda: s.decision(cid, params.get("request_id", ""))}
        case "policies":
            return {"policies": lambda: routes_policies.policies(who, cl)}
        case "policy":
            return {
                "policy": lambda: routes_policies.policy(params.get("name", ""), who, cl),
                "units": lambda: routes_policies.units(who, cl),
                "clusters": s.clusters,
            }
        case "whatif":
            return {"clusters": s.clusters, "policies": lambda: routes_policies.policies(who, cl)}
        case "simulation":
            return {"policies": lambda: routes_policies.policies(who, cl)}
    return {}


async def load_initial(request: Request, page: str, params: dict[str, str]) -> tuple[Any, Problem | None]:
    """The data `page` starts from ({part: JSON or None}; None: its script fetches it all), and the
    problem met getting it."""
    state = _state(request)
    who = principal_of(request, request.cookies.get(SESSION_COOKIE))
    if state is None or who is None or state.clients is None:
        return None, None
    parts = _parts(page, params, who, state.clients)
    if not parts:
        return None, None
    data, problem = await _loads(parts)
    if page == "decision":
        return data["decision"], problem
    return data, problem


__all__ = ["SESSION_COOKIE", "load_initial", "principal_of", "who_is"]
