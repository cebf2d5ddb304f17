"""vmsched's errors as HTTP answers, in one place: a status, and a JSON body

    {"error": {"code": ..., "message": ..., "hint": ..., "location": ..., "errors": [...], "request_id": ...}}

never a traceback. A service's refusal (RemoteError) is answered by its remote code: bad input 422
(with the location), not found 404, conflicts 409, a server or service away 503 with Retry-After and
a hint saying which service to start, not authorized 403. Anything unexpected is logged with the
request's id and answered 500 naming only that id.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vmsched import constants as c
from vmsched.errors import NoConsumer, RemoteError, RequestTooLarge, RpcTimeout, VmschedError
from vmsched.logging import get_logger

log = get_logger("vmsched.api")

#: Seconds a 503 tells the client to wait before trying again.
RETRY_AFTER_S = 5
#: Validation problems listed in one 422 at most.
MAX_LISTED = 50

BAD_INPUT = frozenset(
    {
        "invalid_request",
        "invalid_query",
        "invalid_property",
        "invalid_policy",
        "unknown_policy_unit",
        "unsupported_regex",
        "scheduling_error",
        "policy_error",
    }
)
NOT_FOUND = frozenset({"unknown_cluster", "policy_not_found", "not_found", "decision_not_found"})
CONFLICTS = frozenset({"policy_locked", "policy_in_use", "policy_exists", "state_conflict", "decision_lost"})
UNAVAILABLE = frozenset(
    {
        "server_unavailable",
        "redis_unavailable",
        "database_unavailable",
        "policy_store_unavailable",
        "database_missing",
        "state_resyncing",
        "stale_state",
        "bus_unavailable",
        "bus_error",
        "no_consumer",
        "rpc_timeout",
        "lock_error",
        "lock_timeout",
        "fenced_out",
    }
)
STATUS_OF = {
    **dict.fromkeys(BAD_INPUT, 422),
    **dict.fromkeys(NOT_FOUND, 404),
    **dict.fromkeys(CONFLICTS, 409),
    **dict.fromkeys(UNAVAILABLE, 503),
    "not_authenticated": 401,
    "not_authorized": 403,
    "request_too_large": 413,
}

HINTS = {
    "unknown_cluster": "check the id: GET /api/v1/clusters lists the clusters with state",
    "policy_not_found": "check the name: GET /api/v1/schedulingpolicies lists the policies",
    "policy_locked": "built-in policies cannot change: clone it (POST .../clone) and edit the clone",
    "policy_in_use": "detach the clusters that run it first (DELETE /api/v1/clusters/{id}/policy)",
    "policy_exists": "choose another name",
    "redis_unavailable": "the service cannot reach Redis; send the request again once Redis answers",
    "policy_store_unavailable": "PostgreSQL, which keeps the policies, is away; send it again once it is back",
    "database_unavailable": "PostgreSQL is away; send it again once it is back",
    "database_missing": "the database does not exist: `vmsched db migrate` creates it",
    "state_resyncing": "the cluster waits for the engine's full report; send it again after that",
    "stale_state": "the cluster's state moved on while the request was handled: send it again",
    "lock_timeout": "the cluster is busy: send it again",
    "not_authorized": "the api's RabbitMQ user must be named in the services' VMSCHED_ADMIN_USERS (docs/security.md)",
    "bus_unavailable": "the api cannot reach RabbitMQ; it reconnects by itself: send it again shortly",
    "internal": "the service logged the details under the reference in the message",
}
_QUOTED = re.compile(r"'([a-z.-]+)'")


def service_of(text: str) -> str | None:
    """The service that serves the RPC route a bus error's text names (NoConsumer, RpcTimeout)."""
    for route in _QUOTED.findall(text):
        queue = c.RPC_QUEUES.get(route)
        if queue is not None:
            return queue.split(".")[1]
    return None


def error_body(
    code: str,
    message: str,
    *,
    hint: str | None = None,
    location: str | None = None,
    errors: list[dict[str, str]] | None = None,
    request_id: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message, "hint": hint, "location": location}
    if errors is not None:
        body["errors"] = errors
    if request_id is not None:
        body["request_id"] = request_id
    return {"error": body}


def answer(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    headers = dict(headers or {})
    if status == 503:
        headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(body, status_code=status, headers=headers)


def of_vmsched_error(exc: VmschedError) -> tuple[int, dict[str, Any]]:
    """The status and body that answer `exc`."""
    code = exc.remote_code if isinstance(exc, RemoteError) else exc.code
    status = STATUS_OF.get(code, 503 if exc.retryable else 502 if isinstance(exc, RemoteError) else 500)
    hint = getattr(exc, "hint", None) or HINTS.get(code)
    if isinstance(exc, NoConsumer | RpcTimeout):
        service = service_of(exc.message)
        what = "is not running" if isinstance(exc, NoConsumer) else "did not answer in time (overloaded or stuck?)"
        hint = (
            f"the {service} service {what}: start it (`vmsched run {service}`, or `vmsched up`)"
            if service
            else f"a vmsched service this needs {what}: start the services (`vmsched up`)"
        )
    errors = None
    if code == "invalid_policy":
        errors = policy_problems(exc.message)
    return status, error_body(code, exc.message, hint=hint, location=exc.location, errors=errors)


def policy_problems(message: str) -> list[dict[str, str]]:
    """The problems an `invalid_policy` refusal lists, one per "  - ..." line, each with its location
    ("policy NAME" / "cluster ID") apart from its message."""
    found = []
    for line in message.splitlines():
        text = line.strip()
        if not text.startswith("- "):
            continue
        text = text[2:]
        where, sep, what = text.partition(": ")
        if sep and where.split(" ", 1)[0] in ("policy", "cluster"):
            found.append({"location": where, "message": what})
        else:
            found.append({"location": "", "message": text})
    return found


def validation_problems(exc: RequestValidationError) -> list[dict[str, str]]:
    problems = []
    for err in list(exc.errors())[:MAX_LISTED]:
        location = ".".join(str(p) for p in err.get("loc", ()))
        problems.append({"location": location, "message": str(err.get("msg", "invalid"))[:500]})
    return problems


def request_id(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)
    return rid if isinstance(rid, str) else uuid.uuid4().hex


def install(app: FastAPI) -> None:
    """Register the handlers that turn every failure into the JSON error form."""

    @app.exception_handler(VmschedError)
    async def vmsched_error(request: Request, exc: VmschedError) -> JSONResponse:
        status, body = of_vmsched_error(exc)
        if status >= 500:
            log.warning("request failed", path=request.url.path, code=body["error"]["code"], error=exc.message[:500])
        body["error"]["request_id"] = request_id(request)
        return answer(status, body)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = validation_problems(exc)
        first = problems[0] if problems else {"location": "", "message": "invalid request"}
        message = f"{len(exc.errors())} problem(s); the first: {first['location']}: {first['message']}"
        body = error_body(
            "invalid_request", message, location=first["location"], errors=problems, request_id=request_id(request)
        )
        return answer(422, body)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if getattr(request.state, "body_too_large", False):
            too_large = RequestTooLarge(
                f"the request body is larger than VMSCHED_API_MAX_BODY_BYTES "
                f"({request.app.state.api.settings.api_max_body_bytes} bytes); it was not read to its end"
            )
            return await vmsched_error(request, too_large)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        body = error_body(code, str(exc.detail), request_id=request_id(request))
        return answer(exc.status_code, body, dict(exc.headers or {}))


__all__ = ["answer", "error_body", "install", "of_vmsched_error", "policy_problems", "service_of"]
