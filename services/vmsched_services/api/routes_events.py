"""Server-sent events: what vmsched says about the clusters, as it says it.

    GET /api/v1/events?cluster=*        (text/event-stream)

    : subscribed                       <- sent once the bus subscription is bound
    event: decision                    <- decision | migration | power | ha-alert | ha-recovered | maintenance
    data: {...the message's JSON...}

    : keep-alive                       <- every VMSCHED_API_EVENTS_KEEPALIVE_S while nothing happens

Each client has its own bounded buffer (VMSCHED_API_EVENTS_QUEUE events): one that reads slower than
events come loses the oldest, and is told how many with `event: dropped` (`data: {"dropped": N}`),
instead of holding the bus's consumer. The stream ends, and its subscription with it, when the
client goes away or the api stops.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from vmsched.contracts import (
    HaAlert,
    HaRecovered,
    MaintenancePlan,
    Message,
    MigrationDecision,
    PowerAction,
    ScheduleDecision,
)
from vmsched.errors import InvalidRequest
from vmsched.logging import get_logger
from vmsched_services.api.deps import ClientsDep, Viewer, api_state
from vmsched_services.tools.clikit import vmsched_id

log = get_logger("vmsched.api")
router = APIRouter(tags=["events"])

#: The `event:` name of each message kind.
EVENT_NAMES: dict[type[Message], str] = {
    ScheduleDecision: "decision",
    MigrationDecision: "migration",
    PowerAction: "power",
    HaAlert: "ha-alert",
    HaRecovered: "ha-recovered",
    MaintenancePlan: "maintenance",
}
#: How long (ms) a browser's EventSource waits before it reconnects.
RETRY_MS = 3000


class Buffer:
    """One client's events: bounded, the oldest dropped first, counted."""

    def __init__(self, size: int) -> None:
        self.events: collections.deque[Message] = collections.deque(maxlen=size)
        self.dropped = 0
        self.ready = asyncio.Event()

    async def put(self, event: Message) -> None:
        if len(self.events) == self.events.maxlen:
            self.dropped += 1
        self.events.append(event)
        self.ready.set()

    def drain(self) -> tuple[list[Message], int]:
        events, dropped = list(self.events), self.dropped
        self.events.clear()
        self.dropped = 0
        self.ready.clear()
        return events, dropped


def frame(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data}\n\n".encode()


def _cluster(value: str) -> str:
    if value == "*":
        return value
    try:
        return vmsched_id(value)
    except Exception as exc:
        raise InvalidRequest(str(exc), location="query.cluster") from None


@router.get(
    "/events",
    response_class=StreamingResponse,
    summary="Decisions, migrations, power advice and HA alerts as server-sent events (viewer)",
    responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}, "description": "The stream."}},
)
async def events(
    request: Request,
    _: Viewer,
    cl: ClientsDep,
    cluster: Annotated[str, Query(max_length=64, description="A cluster's id, or * for every cluster.")] = "*",
) -> StreamingResponse:
    settings = api_state(request).settings
    buffer = Buffer(settings.api_events_queue)
    subscription = await cl.scheduler.subscribe_events(_cluster(cluster), buffer.put)
    keepalive = settings.api_events_keepalive_s
    cancelled = False

    async def unsubscribe() -> None:
        nonlocal cancelled
        if not cancelled:
            cancelled = True
            await asyncio.shield(subscription.cancel())

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield f"retry: {RETRY_MS}\n: subscribed\n\n".encode()
            while True:
                try:
                    await asyncio.wait_for(buffer.ready.wait(), keepalive)
                except TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                got, dropped = buffer.drain()
                if dropped:
                    yield frame("dropped", json.dumps({"dropped": dropped}))
                for event in got:
                    yield frame(EVENT_NAMES.get(type(event), "message"), event.model_dump_json())
        finally:
            # The client went away (Starlette cancels the stream) or the server stops.
            await unsubscribe()

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return EventStream(stream(), unsubscribe, media_type="text/event-stream", headers=headers)


class EventStream(StreamingResponse):
    """A StreamingResponse that ends its subscription however the response ends: a client gone
    before the stream's first byte leaves the generator unstarted (its `finally` never runs), and
    one gone mid-send raises out of Starlette before its background tasks."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


__all__ = ["EventStream", "router"]
