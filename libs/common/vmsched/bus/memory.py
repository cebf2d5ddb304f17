"""The Bus in one process, for fast tests: same codec, same dispatcher, no broker.

Buses that share one MemoryBroker talk to each other, so several services can run in one test
process exactly as they would over RabbitMQ (minus the network). Messages still go through JSON,
so a model that does not survive the wire fails here too, and every delivery goes through the same
vmsched.bus.dispatch.Dispatcher as on RabbitMQ (deadline, error replies, dead letters, retries).

The broker is modelled on RabbitMQ's, because the integration tests run the services on both and
a difference between the two is a bug here:

* Messages wait in queues. A route's requests share one queue; a named event queue is shared by
  its subscribers (competing consumers) and outlives them; an unnamed one is a subscription's own
  and goes with it. Publishing returns once the message is queued, not once it was handled.
* Each consumer has at most `settings.prefetch` messages in hand, each handled in a task of its
  own (as aio-pika does); the rest wait in the queue.
* A consumer that goes away (cancelled, or its bus closed) stops its handlers, and what they had
  not settled goes back to the queue, as RabbitMQ requeues what a closed channel had not acked.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import EllipsisType
from typing import Any, TypeVar

from vmsched import constants as c
from vmsched.bus.base import Bus, DeadLetter, RequeueResult, Subscription
from vmsched.bus.codec import decode, encode, type_name
from vmsched.bus.dispatch import Delivery, Dispatcher, Transport, request_headers
from vmsched.contracts import ErrorReply, Message
from vmsched.errors import BusUnavailable, NoConsumer, RemoteError, RpcTimeout
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


#: Where an RPC reply goes: (body, is an ErrorReply). The caller's direct reply-to, in memory.
ReplyFn = Callable[[bytes, bool], None]
#: What a consumer does with one delivery (the dispatcher, with the delivery's transport).
HandleFn = Callable[[Delivery, Transport], Awaitable[object]]


@dataclass(frozen=True)
class _Message:
    delivery: Delivery
    on_reply: ReplyFn | None = None


@dataclass(eq=False)
class _Queue:
    name: str
    #: Topic bindings of an event queue (a route's queue is bound by its name alone).
    bindings: set[str] = field(default_factory=set)
    #: The subscription's own queue (deleted with it) rather than a shared, lasting one.
    exclusive: bool = False
    messages: asyncio.Queue[_Message] = field(default_factory=asyncio.Queue)
    consumers: list[_Consumer] = field(default_factory=list)
    deleted: bool = False


@dataclass
class MemoryBroker:
    """The queues the MemoryBuses on it share, and what they dead-lettered (for tests to read)."""

    #: A route's request queue, by route.
    routes: dict[str, _Queue] = field(default_factory=dict)
    #: Event queues, by name.
    queues: dict[str, _Queue] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)

    def route(self, route: str) -> _Queue:
        return self.routes.setdefault(route, _Queue(route))

    def route_event(self, routing_key: str, message: Callable[[str], _Message]) -> None:
        """Put a copy on every event queue with a binding that matches (one copy per queue)."""
        for q in list(self.queues.values()):
            if any(topic_matches(b, routing_key) for b in q.bindings):
                q.messages.put_nowait(message(q.name))

    def delete(self, queue: _Queue) -> None:
        queue.deleted = True
        if self.queues.get(queue.name) is queue:
            del self.queues[queue.name]

    async def request(
        self,
        route: str,
        body: bytes,
        *,
        headers: dict[str, Any] | None = None,
        timeout: float = 10.0,
        user_id: str | None = None,
    ) -> tuple[bytes, bool]:
        """Put `body` on `route` as a request; return (reply body, is an ErrorReply). RpcTimeout if none comes."""
        q = self.routes.get(route)
        if q is None or not q.consumers:
            raise NoConsumer(f"no service serves {route!r}")
        got: asyncio.Future[tuple[bytes, bool]] = asyncio.get_running_loop().create_future()

        def reply(body: bytes, error: bool) -> None:
            if not got.done():
                got.set_result((body, error))

        delivery = Delivery(
            queue=route,
            body=body,
            routing_key=route,
            headers=headers or {},
            exchange=c.rpc_exchange(route),
            reply_to="memory",
            correlation_id=uuid.uuid4().hex,
            user_id=user_id,
        )
        # Like a broker, the request stays queued after a caller that stopped waiting (its deadline drops it).
        q.messages.put_nowait(_Message(delivery, reply))
        try:
            async with asyncio.timeout(timeout):
                return await got
        except TimeoutError:
            if not q.consumers:
                raise NoConsumer(f"no service is consuming {route!r}") from None
            raise RpcTimeout(f"no reply to {route!r} within {timeout:g} s") from None


class _MemoryTransport(Transport):
    """Settling in memory: a reject goes to the dead letters as the broker's dead-letter exchange would."""

    def __init__(self, broker: MemoryBroker, queue: _Queue, message: _Message) -> None:
        self.broker, self.queue, self.message = broker, queue, message
        #: Acked or rejected: the broker no longer holds it for this consumer.
        self.settled = False

    async def reply(self, body: bytes, *, type_: str, error: bool) -> None:
        if self.message.on_reply is not None:
            self.message.on_reply(body, error)

    async def dead_letter(self, body: bytes, headers: dict[str, Any]) -> None:
        # As on RabbitMQ: the copy goes to the dead-letter exchange under the refusing queue's name.
        d = self.message.delivery
        self.broker.dead_letters.append(DeadLetter.parse(d.queue, body, headers, d.type))

    async def retry(self, headers: dict[str, Any]) -> None:
        if self.queue.deleted:
            raise NoConsumer(f"queue {self.queue.name} is gone: the retry copy was returned")
        copy = replace(self.message, delivery=replace(self.message.delivery, headers=headers))
        self.queue.messages.put_nowait(copy)

    async def ack(self) -> None:
        self.settled = True

    async def reject(self) -> None:
        self.settled = True
        d = self.message.delivery
        # The broker's own dead-lettering: the message as it was, described by an x-death entry.
        death = {
            "queue": d.queue,
            "reason": "rejected",
            "exchange": d.exchange,
            "routing-keys": [d.routing_key],
            "time": datetime.now(UTC),
            "count": 1,
        }
        headers = {**d.headers, "x-death": [death]}
        self.broker.dead_letters.append(DeadLetter.parse(d.routing_key, d.body, headers, d.type))


class _Consumer(Subscription):
    """One consumer on a queue: at most `prefetch` messages in hand, each handled in its own task."""

    def __init__(self, broker: MemoryBroker, queue: _Queue, handle: HandleFn, prefetch: int) -> None:
        self.broker, self.queue, self.handle = broker, queue, handle
        self._window = asyncio.Semaphore(prefetch)
        self._in_hand: set[asyncio.Task[None]] = set()
        self._cancelled = False
        queue.consumers.append(self)
        self._pump = asyncio.create_task(self._take())

    async def _take(self) -> None:
        while True:
            await self._window.acquire()
            try:
                message = await self.queue.messages.get()
            except BaseException:
                self._window.release()
                raise
            task = asyncio.create_task(self._run(message))
            self._in_hand.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_hand.discard(task)
        self._window.release()

    async def _run(self, message: _Message) -> None:
        transport = _MemoryTransport(self.broker, self.queue, message)
        try:
            await self.handle(message.delivery, transport)
        except asyncio.CancelledError:
            if not transport.settled and not self.queue.deleted:
                self.queue.messages.put_nowait(message)  # not acked: the broker delivers it again
            raise

    async def pause(self) -> None:
        if self._cancelled or self.queue.exclusive or self not in self.queue.consumers:
            return
        # As basic.cancel: take nothing more (the queue's other consumers get it), finish what is in hand.
        self.queue.consumers.remove(self)
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)

    async def resume(self) -> bool:
        if not self._cancelled and self not in self.queue.consumers:
            self.queue.consumers.append(self)
            self._pump = asyncio.create_task(self._take())
        return True

    async def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        if self in self.queue.consumers:
            self.queue.consumers.remove(self)
        if self.queue.exclusive:
            self.broker.delete(self.queue)
        self._pump.cancel()
        current = asyncio.current_task()
        stopping = [t for t in (self._pump, *self._in_hand) if t is not current]
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)


class MemoryBus(Bus):
    """A bus whose broker is in this process. What it publishes carries `user_id` as RabbitMQ's
    would: the user of amqp_url unless given (a test plays another identity with it, or None: a
    sender that names none)."""

    def __init__(
        self,
        settings: Settings,
        broker: MemoryBroker | None = None,
        service: str = "client",
        *,
        user_id: str | EllipsisType | None = ...,
    ) -> None:
        self.settings = settings
        #: Stamped on every request and event this bus sends, as the AMQP user_id property RabbitMQ
        #: vouches for (None: none, as a sender that sets none); tests vary it to test authorization.
        self.user_id: str | None = settings.amqp_user if isinstance(user_id, EllipsisType) else user_id
        self.broker = broker or MemoryBroker()
        self.service = service
        self.dispatcher = Dispatcher(settings, service)
        self._consumers: list[_Consumer] = []
        self._closed = False

    async def start(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            await consumer.cancel()

    def _check_open(self) -> None:
        if self._closed:
            raise BusUnavailable("the bus is closed")

    async def call(self, route: str, request: Message, reply_type: type[Rep], *, timeout: float | None = None) -> Rep:
        self._check_open()
        timeout = timeout or self.settings.rpc_timeout_s
        body, is_error = await self.broker.request(
            route,
            encode(request),
            headers=request_headers(int((time.time() + timeout) * 1000)),
            timeout=timeout,
            user_id=self.user_id,
        )
        if is_error:
            err = decode(body, ErrorReply)
            raise RemoteError(err.code, err.message, location=err.location)
        return decode(body, reply_type)

    async def serve(
        self, route: str, request_type: type[Req], handler: Callable[[Req], Awaitable[Message]]
    ) -> Subscription:
        self._check_open()

        async def handle(delivery: Delivery, transport: Transport) -> str:
            return await self.dispatcher.request(delivery, transport, request_type, handler)

        return await self._consume(self.broker.route(route), handle)

    async def publish(
        self, routing_key: str, event: Message, *, persistent: bool = True, message_id: str | None = None
    ) -> None:
        self._check_open()
        body, type_ = encode(event), type_name(event)
        self._route_event(routing_key, body, type_, user_id=self.user_id)

    def _route_event(
        self,
        routing_key: str,
        body: bytes,
        type_: str | None,
        headers: dict[str, Any] | None = None,
        *,
        user_id: str | None = None,
    ) -> None:
        self.broker.route_event(
            routing_key,
            lambda queue: _Message(
                Delivery(
                    queue=queue,
                    body=body,
                    routing_key=routing_key,
                    headers=headers or {},
                    type=type_,
                    exchange=c.EVENTS_EXCHANGE,
                    user_id=user_id,
                )
            ),
        )

    async def subscribe(
        self,
        bindings: Sequence[str],
        models: Sequence[type[Message]],
        handler: Callable[[Any], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        self._check_open()
        by_name = {m.__name__: m for m in models}
        if queue is None:
            q = _Queue(f"memory.gen-{uuid.uuid4().hex}", exclusive=True)
            self.broker.queues[q.name] = q
        else:
            q = self.broker.queues.setdefault(queue, _Queue(queue))
        q.bindings.update(bindings)

        async def handle(delivery: Delivery, transport: Transport) -> str:
            return await self.dispatcher.event(delivery, transport, by_name, handler)

        return await self._consume(q, handle)

    def is_open(self) -> bool:
        return not self._closed

    async def queue_depths(self, queues: Sequence[str]) -> dict[str, int | None]:
        self._check_open()
        # A route's queue is kept by route here; RabbitMQ knows it by its name in RPC_QUEUES.
        by_name = {c.RPC_QUEUES.get(route, f"vmsched.{route}"): q for route, q in self.broker.routes.items()}
        out: dict[str, int | None] = {}
        for name in queues:
            if name == c.DEAD_LETTER_QUEUE:
                out[name] = len(self.broker.dead_letters)
                continue
            q = by_name.get(name) or self.broker.queues.get(name)
            out[name] = q.messages.qsize() if q is not None and not q.deleted else None
        return out

    # ------------------------------------------------------------------ operations
    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return list(self.broker.dead_letters[: max(limit, 0)])

    async def requeue_dead_letters(self, ids: Collection[str] | None = None) -> RequeueResult:
        wanted = None if ids is None else set(ids)
        result = RequeueResult()
        kept: list[DeadLetter] = []
        for dl in self.broker.dead_letters:
            if wanted is not None and dl.id not in wanted:
                kept.append(dl)
                continue
            why = dl.unrequeueable((*c.RPC_EXCHANGES, c.EVENTS_EXCHANGE, ""))
            if why is None and not self._send_again(dl):
                why = "no queue takes its routing key now"
            if why is None:
                result.requeued.append(dl.id)
            else:
                result.skipped[dl.id] = why
                kept.append(dl)
        self.broker.dead_letters[:] = kept
        return result

    def _send_again(self, dl: DeadLetter) -> bool:
        """Put a dead letter back where it was published; False if nothing would take it. It goes
        naming no sender, as the AMQP requeue sends it: the requeuer does not vouch for whoever sent
        it first, so a removal or administration request requeued is refused, not laundered."""
        headers = dl.requeue_headers()
        if dl.exchange == c.EVENTS_EXCHANGE:
            if not any(any(topic_matches(b, dl.routing_key) for b in q.bindings) for q in self.broker.queues.values()):
                return False
            self._route_event(dl.routing_key, dl.body, dl.type, headers)
            return True
        # The RPC exchange routes by route; the default exchange (a retry copy's) by queue name.
        queue = self.broker.routes.get(dl.routing_key) or self.broker.queues.get(dl.routing_key)
        if queue is None:
            return False
        delivery = Delivery(
            queue=queue.name,
            body=dl.body,
            routing_key=dl.routing_key,
            headers=headers,
            type=dl.type,
            exchange=dl.exchange or "",
        )
        queue.messages.put_nowait(_Message(delivery))
        return True

    async def _consume(self, queue: _Queue, handle: HandleFn) -> Subscription:
        consumer = _Consumer(self.broker, queue, handle, self.settings.prefetch)
        self._consumers.append(consumer)
        return await self._kept(consumer)

    def subscriptions(self) -> Sequence[Subscription]:
        return list(self._consumers)
