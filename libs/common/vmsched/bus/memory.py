"""The Bus in one process, for fast tests: same codec, same dispatcher, no broker.

Buses that share one MemoryBroker talk to each other, so several services can run in one test
process exactly as they would over RabbitMQ (minus the network). Messages still go through JSON,
so a model that does not survive the wire fails here too, and every delivery goes through the same
vmsched.bus.dispatch.Dispatcher as on RabbitMQ (deadline, error replies, dead letters, retries).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from vmsched import constants as c
from vmsched.bus.base import Bus, DeadLetter, Subscription
from vmsched.bus.codec import decode, encode, type_name
from vmsched.bus.dispatch import HEADER_DEADLINE, Delivery, Dispatcher, Transport
from vmsched.contracts import ErrorReply, Message
from vmsched.errors import NoConsumer, RemoteError, RpcTimeout
from vmsched.settings import Settings

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic matching: `*` is exactly one word, `#` zero or more."""
    p, k = pattern.split("."), key.split(".")

    def match(i: int, j: int) -> bool:
        if i == len(p):
            return j == len(k)
        if p[i] == "#":
            return any(match(i + 1, jj) for jj in range(j, len(k) + 1))
        return j < len(k) and (p[i] == "*" or p[i] == k[j]) and match(i + 1, j + 1)

    return match(0, 0)


#: Where a served route takes one delivery; `reply` receives (body, is an ErrorReply).
ServeFn = Callable[[Delivery, Callable[[bytes, bool], None]], Awaitable[None]]


@dataclass
class _Route:
    handlers: list[ServeFn] = field(default_factory=list)
    turn: itertools.count[int] = field(default_factory=itertools.count)


@dataclass
class _Sub:
    bindings: Sequence[str]
    deliver: Callable[[str, bytes, str], Awaitable[None]]


@dataclass
class MemoryBroker:
    routes: dict[str, _Route] = field(default_factory=dict)
    subs: list[_Sub] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: Background deliveries (requests, retries), so a closing bus can cancel what it started.
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        async def run() -> None:
            await coro

        task = asyncio.create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def request(
        self, route: str, body: bytes, *, headers: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> tuple[bytes, bool]:
        """Put `body` on `route` as a request; return (reply body, is an ErrorReply). RpcTimeout if none comes."""
        r = self.routes.get(route)
        if r is None or not r.handlers:
            raise NoConsumer(f"no service serves {route!r}")
        serve = r.handlers[next(r.turn) % len(r.handlers)]
        got: asyncio.Future[tuple[bytes, bool]] = asyncio.get_running_loop().create_future()

        def reply(body: bytes, error: bool) -> None:
            if not got.done():
                got.set_result((body, error))

        delivery = Delivery(
            queue=route,
            body=body,
            routing_key=route,
            headers=headers or {},
            reply_to="memory",
            correlation_id=uuid.uuid4().hex,
        )
        # Like a broker, the request outlives a caller that stopped waiting.
        self.spawn(serve(delivery, reply))
        try:
            async with asyncio.timeout(timeout):
                return await got
        except TimeoutError:
            raise RpcTimeout(f"no reply to {route!r} within {timeout:g} s") from None


class _MemorySubscription(Subscription):
    def __init__(self, remove: Callable[[], None]) -> None:
        self._remove = remove

    async def cancel(self) -> None:
        self._remove()


class _MemoryTransport(Transport):
    """Settling in memory: a reject goes to the dead letters as the broker's dead-letter exchange would."""

    def __init__(
        self,
        broker: MemoryBroker,
        delivery: Delivery,
        on_reply: Callable[[bytes, bool], None] | None,
        again: Callable[[Delivery], Awaitable[None]],
    ) -> None:
        self.broker, self.delivery, self.on_reply, self.again = broker, delivery, on_reply, again

    async def reply(self, body: bytes, *, type_: str, error: bool) -> None:
        if self.on_reply is not None:
            self.on_reply(body, error)

    async def dead_letter(self, body: bytes, headers: dict[str, Any]) -> None:
        reason = str(headers.get(c.HEADER_DLX_REASON, ""))
        self.broker.dead_letters.append(
            DeadLetter(self.delivery.queue, self.delivery.routing_key, reason, body, headers)
        )

    async def retry(self, headers: dict[str, Any]) -> None:
        self.broker.spawn(self.again(replace(self.delivery, headers=headers)))

    async def ack(self) -> None:
        return None

    async def reject(self) -> None:
        d = self.delivery
        self.broker.dead_letters.append(DeadLetter(d.queue, d.routing_key, "rejected", d.body, dict(d.headers)))


class MemoryBus(Bus):
    def __init__(self, settings: Settings, broker: MemoryBroker | None = None, service: str = "client") -> None:
        self.settings = settings
        self.broker = broker or MemoryBroker()
        self.service = service
        self.dispatcher = Dispatcher(settings, service)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def call(self, route: str, request: Message, reply_type: type[Rep], *, timeout: float | None = None) -> Rep:
        timeout = timeout or self.settings.rpc_timeout_s
        body, is_error = await self.broker.request(
            route,
            encode(request),
            headers={HEADER_DEADLINE: int((time.time() + timeout) * 1000)},
            timeout=timeout,
        )
        if is_error:
            err = decode(body, ErrorReply)
            raise RemoteError(err.code, err.message, location=err.location)
        return decode(body, reply_type)

    async def serve(
        self, route: str, request_type: type[Req], handler: Callable[[Req], Awaitable[Message]]
    ) -> Subscription:
        async def run(delivery: Delivery, on_reply: Callable[[bytes, bool], None]) -> None:
            async def again(d: Delivery) -> None:
                await run(d, on_reply)

            transport = _MemoryTransport(self.broker, delivery, on_reply, again)
            await self.dispatcher.request(delivery, transport, request_type, handler)

        r = self.broker.routes.setdefault(route, _Route())
        r.handlers.append(run)
        return _MemorySubscription(lambda: r.handlers.remove(run))

    async def publish(self, routing_key: str, event: Message, *, persistent: bool = True) -> None:
        body = encode(event)
        for sub in list(self.broker.subs):
            if any(topic_matches(b, routing_key) for b in sub.bindings):
                await sub.deliver(routing_key, body, type_name(event))

    async def subscribe(
        self,
        bindings: Sequence[str],
        models: Sequence[type[Message]],
        handler: Callable[[Any], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        by_name = {m.__name__: m for m in models}
        name = queue or f"memory-{id(handler)}"

        async def run(delivery: Delivery) -> None:
            transport = _MemoryTransport(self.broker, delivery, None, run)
            await self.dispatcher.event(delivery, transport, by_name, handler)

        async def deliver(routing_key: str, body: bytes, type_: str) -> None:
            await run(Delivery(queue=name, body=body, routing_key=routing_key, type=type_))

        sub = _Sub(bindings, deliver)
        self.broker.subs.append(sub)
        return _MemorySubscription(lambda: self.broker.subs.remove(sub))
