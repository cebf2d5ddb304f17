"""What every HTTP request goes through before and after its route: a request id, the body cap,
the per-route metrics, and the last catch of anything unexpected (a 500 naming the request id, the
traceback in the log only).

A plain ASGI middleware, not Starlette's BaseHTTPMiddleware: it must see the body as it streams in
(to stop reading at the cap) and must not buffer the event streams.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vmsched.errors import RequestTooLarge
from vmsched.logging import get_logger
from vmsched.metrics import HTTP_REQUESTS, HTTP_SECONDS
from vmsched_services.api.error_map import error_body

log = get_logger("vmsched.api")

REQUEST_ID_HEADER = b"x-request-id"
#: Set in the request's state when its body passed the cap (see RequestGuard._capped).
BODY_TOO_LARGE = "body_too_large"


def too_large(cap: int) -> RequestTooLarge:
    """The error for a body over `cap` bytes."""
    return RequestTooLarge(
        f"the request body is larger than {cap} bytes (VMSCHED_API_MAX_BODY_BYTES); nothing was read"
    )


class RequestGuard:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.cap = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        started = time.perf_counter()
        status = [500]
        response_started = [False]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_started[0] = True
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (REQUEST_ID_HEADER, rid.encode())]}
            await send(message)

        try:
            if self._declared_too_large(scope):
                await self._refuse(
                    sending, 413, error_body("request_too_large", str(too_large(self.cap)), request_id=rid)
                )
            else:
                await self.app(scope, self._capped(scope, receive), sending)
        except RequestTooLarge as exc:
            if not response_started[0]:
                await self._refuse(sending, 413, error_body(exc.code, exc.message, request_id=rid))
        except Exception as exc:
            log.error("unexpected error", path=scope.get("path"), request_id=rid, exc_info=exc)
            if not response_started[0]:
                message = f"internal error (request {rid}); the api's log has the details under that id"
                await self._refuse(sending, 500, error_body("internal", message, request_id=rid))
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            HTTP_REQUESTS.labels(route, scope.get("method", ""), str(status[0])).inc()
            HTTP_SECONDS.labels(route).observe(time.perf_counter() - started)

    def _declared_too_large(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    return int(value) > self.cap
                except ValueError:
                    return False
        return False

    def _capped(self, scope: Scope, receive: Receive) -> Receive:
        """`receive`, raising RequestTooLarge once the body read so far passes the cap: a chunked body
        that never ends is not read to its end. FastAPI turns any failure reading a body into a 400, so
        the scope's state says why (BODY_TOO_LARGE), for error_map to answer 413."""
        seen = [0]
        cap = self.cap

        async def capped() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > cap:
                    scope["state"][BODY_TOO_LARGE] = True
                    raise too_large(cap)
            return message

        return capped

    @staticmethod
    async def _refuse(send: Send, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})


__all__ = ["BODY_TOO_LARGE", "RequestGuard", "too_large"]
