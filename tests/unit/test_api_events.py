"""The api's event stream ends its bus subscription however its response ends."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from vmsched_services.api.routes_events import EventStream


class Closed:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1


async def never_started() -> AsyncIterator[bytes]:
    yield b": subscribed\n\n"


async def nothing() -> MutableMapping[str, Any]:
    return {"type": "http.disconnect"}


SCOPE: dict[str, Any] = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "GET", "path": "/"}


async def test_a_client_gone_before_the_first_byte_still_ends_the_subscription() -> None:
    closed = Closed()

    async def gone(message: MutableMapping[str, Any]) -> None:
        raise OSError("the connection is closed")

    with pytest.raises(ClientDisconnect):
        await EventStream(never_started(), closed)(SCOPE, nothing, gone)
    assert closed.calls == 1


async def test_a_stream_that_ends_normally_ends_the_subscription_once() -> None:
    closed, sent = Closed(), list[MutableMapping[str, Any]]()

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await EventStream(never_started(), closed)(SCOPE, nothing, send)
    assert closed.calls == 1
    assert any(m.get("body") == b": subscribed\n\n" for m in sent)
