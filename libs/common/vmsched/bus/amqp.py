"""The Bus on RabbitMQ (aio-pika). See vmsched.bus.base for the contract.

Choices, and why:
* RPC uses RabbitMQ direct reply-to (no reply queue per client; the reply consumer must be on the
  same channel that publishes the requests, in no-ack mode). aio_pika.patterns.RPC is not used:
  it pickles by default.
* A call's timeout bounds everything: the request carries `expiration` (the broker drops it if no
  service took it in time, into the dead-letter exchange) and an `x-deadline-ms` header (a service
  that takes it late does not work on it), and the caller waits at most that long.
* What happens to a delivered message (decode, handler, reply, dead letter, retry, ack or reject)
  is decided by vmsched.bus.dispatch, shared with MemoryBus; this module only gives it the
  primitives (`_AmqpTransport`). Publisher confirms everywhere, so "published" means the broker took it.
* connect_robust reconnects and restores exchanges, queues and consumers. The reply-to consumer is
  a pseudo-queue it does not restore: it is re-registered when the RPC channel reopens, and `call`
  waits (within its timeout) until it is back before publishing, because RabbitMQ refuses a request
  whose reply-to has no consumer by closing the channel (PRECONDITION_FAILED - fast reply consumer
  does not exist). While the broker is away every operation raises BusUnavailable, never an
  aio-pika exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
    DeliveryMode,
    ExchangeType,
)
from yarl import URL

from vmsched import constants as c
from vmsched.bus.base import Bus, Subscription
from vmsched.bus.codec import CONTENT_TYPE, decode, encode, safe_text, type_name
from vmsched.bus.dispatch import HEADER_DEADLINE, TRANSIENT, Delivery, Dispatcher, Transport
from vmsched.contracts import ErrorReply, Message
from vmsched.errors import BusUnavailable, NoConsumer, RemoteError, RpcTimeout, VmschedError
from vmsched.logging import get_logger
from vmsched.metrics import RPC_ERRORS, RPC_SECONDS
from vmsched.settings import Settings

log = get_logger("vmsched.bus")

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)

__all__ = ["HEADER_DEADLINE", "TRANSIENT", "AmqpBus", "dead_letter_queue_arguments"]

REPLY_TO = "amq.rabbitmq.reply-to"
#: Dead-letter queue bound in messages: old refused messages are dropped first beyond this many.
DLQ_MAX_LENGTH = 100_000
#: Bound on cancelling a consumer (a robust channel waits for a lost connection to come back).
CANCEL_TIMEOUT_S = 5.0
#: What aio-pika / aiormq raise when the broker is away or a channel broke under us.
BROKER_ERRORS = (aiormq.exceptions.AMQPError, ConnectionError, OSError, RuntimeError)


def dead_letter_queue_arguments(settings: Settings) -> dict[str, Any]:
    """The dead-letter queue's arguments: bounded in messages and in bytes, oldest dropped first.

    One function, because a redeclaration with other arguments is refused by the broker.
    """
    return {
        "x-max-length": DLQ_MAX_LENGTH,
        "x-max-length-bytes": settings.dead_letter_queue_max_bytes,
        "x-overflow": "drop-head",
    }


def redacted(url: str) -> str:
    """The AMQP URL without its password, for messages and logs."""
    try:
        u = URL(url)
        return str(u.with_password("***")) if u.password else str(u)
    except Exception:
        return "<unparsable AMQP URL>"


def broker_address(url: str) -> str:
    try:
        u = URL(url)
        return f"{u.host}:{u.port or 5672}"
    except Exception:
        return redacted(url)


class _AmqpTransport(Transport):
    """The dispatcher's primitives on one delivery; each publish waits for the broker's confirm."""

    def __init__(
        self, ch: AbstractChannel, dlx: AbstractExchange, queue: str, message: AbstractIncomingMessage, bound_s: float
    ) -> None:
        self.ch, self.dlx, self.queue, self.message, self.bound_s = ch, dlx, queue, message, bound_s

    async def reply(self, body: bytes, *, type_: str, error: bool) -> None:
        async with asyncio.timeout(self.bound_s):
            await self.ch.default_exchange.publish(
                aio_pika.Message(
                    body,
                    content_type=CONTENT_TYPE,
                    type=type_,
                    correlation_id=self.message.correlation_id,
                    headers={c.HEADER_ERROR: 1} if error else {},
                    delivery_mode=DeliveryMode.NOT_PERSISTENT,
                ),
                routing_key=self.message.reply_to or "",
                mandatory=False,
            )

    async def dead_letter(self, body: bytes, headers: dict[str, Any]) -> None:
        async with asyncio.timeout(self.bound_s):
            await self.dlx.publish(
                aio_pika.Message(
                    body,
                    headers=headers,
                    content_type=self.message.content_type,
                    type=self.message.type,
                    correlation_id=self.message.correlation_id,
                    delivery_mode=DeliveryMode.PERSISTENT,
                ),
                routing_key=self.queue,
                mandatory=False,
            )

    async def retry(self, headers: dict[str, Any]) -> None:
        m = self.message
        async with asyncio.timeout(self.bound_s):
            result = await self.ch.default_exchange.publish(
                aio_pika.Message(
                    m.body,
                    headers=headers,
                    content_type=m.content_type,
                    type=m.type,
                    correlation_id=m.correlation_id,
                    reply_to=m.reply_to,
                    delivery_mode=m.delivery_mode or DeliveryMode.PERSISTENT,
                ),
                routing_key=self.queue,
                mandatory=True,
            )
        if isinstance(result, aiormq.abc.DeliveredMessage):
            raise NoConsumer(f"queue {self.queue} is gone: the retry copy was returned")

    async def ack(self) -> None:
        async with asyncio.timeout(self.bound_s):
            await self.message.ack()

    async def reject(self) -> None:
        async with asyncio.timeout(self.bound_s):
            await self.message.reject(requeue=False)


def _delivery(queue: str, message: AbstractIncomingMessage) -> Delivery:
    return Delivery(
        queue=queue,
        body=message.body,
        routing_key=message.routing_key or "",
        headers=dict(message.headers or {}),
        type=message.type,
        reply_to=message.reply_to,
        correlation_id=message.correlation_id,
    )


class _Consumer(Subscription):
    def __init__(self, channel: AbstractChannel, queue: AbstractQueue, tag: str) -> None:
        self._channel, self._queue, self._tag = channel, queue, tag

    async def cancel(self) -> None:
        # A robust channel whose connection is gone waits for it forever: cancel only a live one, bounded.
        if not self._channel.is_closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CANCEL_TIMEOUT_S):
                    await self._queue.cancel(self._tag)
        with contextlib.suppress(Exception):
            await self._channel.close()


class AmqpBus(Bus):
    def __init__(self, settings: Settings, service: str = "client") -> None:
        self.settings = settings
        self.service = service
        self.dispatcher = Dispatcher(settings, service)
        self._conn: AbstractRobustConnection | None = None
        self._rpc_channel: AbstractChannel | None = None
        self._rpc_exchange: AbstractExchange | None = None
        self._events: AbstractExchange | None = None
        self._pending: dict[str, asyncio.Future[AbstractIncomingMessage]] = {}
        self._subscriptions: list[Subscription] = []
        #: Set while the direct reply-to consumer is registered on the open RPC channel.
        self._replies_ready = asyncio.Event()
        #: How many times the reply consumer was registered (a retry waits for a newer one).
        self._reply_generation = 0
        self._reply_tag: str | None = None
        #: False when an older dead-letter queue (declared with other arguments) is used as it is.
        self.dead_letter_queue_bounded = True
        self._dlq_warned = False

    def name(self, raw: str) -> str:
        """Exchange and queue names carry the configured prefix (tests isolate runs with it)."""
        return f"{self.settings.amqp_prefix}{raw}"

    def rpc_queue(self, route: str) -> str:
        """The queue a route's servers consume (RPC_QUEUES for the services' routes)."""
        return self.name(c.RPC_QUEUES.get(route, f"vmsched.{route}"))

    @property
    def connection(self) -> AbstractRobustConnection:
        if self._conn is None:
            raise RuntimeError("bus not started")
        return self._conn

    def _unavailable(self, exc: BaseException | str) -> BusUnavailable:
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {safe_text(exc, 500)}"
        return BusUnavailable(
            f"RabbitMQ at {broker_address(self.settings.amqp_url)} is unreachable: {why}; it reconnects by itself"
        )

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        try:
            self._conn = await aio_pika.connect_robust(
                self.settings.amqp_url,
                client_properties={"connection_name": f"vmsched-{self.service}"},
                reconnect_interval=self.settings.amqp_reconnect_interval_s,
                timeout=self.settings.rpc_timeout_s,
            )
        except (*BROKER_ERRORS, TimeoutError) as exc:
            raise BusUnavailable(
                f"RabbitMQ at {redacted(self.settings.amqp_url)} is unreachable: {type(exc).__name__}: "
                f"{safe_text(exc, 500)}; start the broker, or point VMSCHED_AMQP_URL at a running one"
            ) from None
        try:
            self._rpc_channel = await self._conn.channel(publisher_confirms=True)
            await self._declare_topology(self._rpc_channel)
            self._rpc_exchange = await self._rpc_channel.get_exchange(self.name(c.RPC_EXCHANGE), ensure=False)
            self._events = await self._rpc_channel.get_exchange(self.name(c.EVENTS_EXCHANGE), ensure=False)
            await self._consume_replies()
        except BROKER_ERRORS as exc:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
            raise self._unavailable(exc) from None
        # A robust channel restores declared queues, not the reply-to pseudo-queue: redo it.
        self._rpc_channel.reopen_callbacks.add(self._on_rpc_reopen)
        self._rpc_channel.close_callbacks.add(self._on_rpc_close)
        self._conn.close_callbacks.add(self._on_rpc_close)

    async def close(self) -> None:
        for sub in self._subscriptions:
            await sub.cancel()
        self._subscriptions.clear()
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def _declare_topology(self, ch: AbstractChannel) -> None:
        await ch.declare_exchange(self.name(c.RPC_EXCHANGE), ExchangeType.DIRECT, durable=True)
        await ch.declare_exchange(self.name(c.EVENTS_EXCHANGE), ExchangeType.TOPIC, durable=True)
        await ch.declare_exchange(self.name(c.DEAD_LETTER_EXCHANGE), ExchangeType.TOPIC, durable=True)
        await self._declare_dead_letter_queue()

    async def _declare_dead_letter_queue(self) -> None:
        """Declare and bind the dead-letter queue; keep an existing one declared with other arguments.

        A durable queue redeclared with other arguments is refused (PRECONDITION_FAILED) and the
        refusal closes the channel: this runs on throwaway aiormq channels, never the RPC channel.
        """
        name = self.name(c.DEAD_LETTER_QUEUE)
        wanted = dead_letter_queue_arguments(self.settings)
        transport = self.connection.transport
        if transport is None:
            raise ConnectionError("no connection to RabbitMQ")
        amqp = transport.connection
        ch = await amqp.channel()
        try:
            await ch.queue_declare(name, durable=True, arguments=wanted)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            self.dead_letter_queue_bounded = False
            policy = json.dumps({k.removeprefix("x-"): v for k, v in wanted.items()})
            (log.debug if self._dlq_warned else log.warning)(
                "the dead-letter queue exists with other arguments; using it as it is (not bounded by bytes)",
                queue=name,
                broker_said=str(exc),
                wanted=wanted,
                to_migrate=(
                    f"delete the queue once its dead letters are read (rabbitmqctl delete_queue {name}) and "
                    f"restart the services, or bound it with a policy: rabbitmqctl set_policy "
                    f"vmsched-dead-letter '^{name}$' '{policy}' --apply-to queues"
                ),
            )
            self._dlq_warned = True
            ch = await amqp.channel()  # the refusal closed the first one
            await ch.queue_declare(name, passive=True)
        try:
            await ch.queue_bind(name, self.name(c.DEAD_LETTER_EXCHANGE), routing_key="#")
        finally:
            with contextlib.suppress(Exception):
                await ch.close()

    def _queue_arguments(self) -> dict[str, Any]:
        return {"x-dead-letter-exchange": self.name(c.DEAD_LETTER_EXCHANGE)}

    async def _ready(self, timeout: float) -> None:
        """Wait (at most `timeout`) for the connection and the RPC channel; BusUnavailable if they stay away."""
        conn, ch = self.connection, self._rpc_channel
        if conn.is_closed:
            raise BusUnavailable("the bus is closed")
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                await conn.connected.wait()
                if ch is not None:
                    await ch.ready()  # type: ignore[attr-defined]  # RobustChannel has it; the abstract type does not
        except TimeoutError:
            raise self._unavailable(f"no connection within {timeout:g} s") from None

    # ------------------------------------------------------------------ RPC client
    async def _consume_replies(self) -> None:
        assert self._rpc_channel is not None
        queue = aio_pika.Queue(
            self._rpc_channel, REPLY_TO, durable=False, exclusive=False, auto_delete=False, arguments=None
        )
        self._reply_tag = await queue.consume(self._on_reply, no_ack=True)
        self._reply_generation += 1
        self._replies_ready.set()

    async def _on_rpc_reopen(self, *_: object) -> None:
        try:
            await self._consume_replies()
        except Exception as exc:
            # Calls wait for the consumer and then raise BusUnavailable; the next reopen tries again.
            log.warning("could not register the reply consumer again", error=repr(exc))

    def _on_rpc_close(self, *_: object) -> None:
        self._replies_ready.clear()
        # Replies to calls made on the old channel can never arrive.
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(
                    self._unavailable("the connection was lost while waiting for the reply (it may have been handled)")
                )

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        fut = self._pending.pop(message.correlation_id or "", None)
        if fut is not None and not fut.done():
            fut.set_result(message)

    async def _wait_for_replies(self, deadline: float, newer_than: int) -> bool:
        """Until the reply consumer is registered (a newer one than `newer_than`), or BusUnavailable at the deadline.

        True if it had to wait (the connection or the RPC channel was being restored).
        """
        loop = asyncio.get_running_loop()
        ch = self._rpc_channel
        waited = False
        while not (
            self._replies_ready.is_set() and self._reply_generation > newer_than and ch is not None and not ch.is_closed
        ):
            if self.connection.is_closed:
                raise BusUnavailable("the bus is closed")
            if loop.time() >= deadline:
                raise self._unavailable("the reply consumer is not registered again yet")
            waited = True
            await asyncio.sleep(0.02)
        return waited

    async def call(self, route: str, request: Message, reply_type: type[Rep], *, timeout: float | None = None) -> Rep:
        timeout = timeout or self.settings.rpc_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout
        started = time.perf_counter()
        body = encode(request)
        newer_than = 0
        waited = False
        try:
            while True:
                waited = await self._wait_for_replies(deadline, newer_than) or waited
                generation = self._reply_generation
                reply = await self._send(route, body, type_name(request), timeout, deadline, retry=newer_than == 0)
                if reply is not None:
                    break
                newer_than = generation  # refused for want of a reply consumer: wait for a new one, once
        except TimeoutError:
            if waited:
                # The outage took the call's time; "too slow" would send the operator to the wrong place.
                RPC_ERRORS.labels(route, "unavailable").inc()
                raise self._unavailable(
                    f"the connection came back too late for a reply within the call's {timeout:g} s"
                ) from None
            RPC_ERRORS.labels(route, "timeout").inc()
            raise await self._timeout_error(route, timeout) from None
        except NoConsumer:
            RPC_ERRORS.labels(route, "no_consumer").inc()
            raise
        except BusUnavailable:
            RPC_ERRORS.labels(route, "unavailable").inc()
            raise
        RPC_SECONDS.labels(route).observe(time.perf_counter() - started)
        if reply.headers.get(c.HEADER_ERROR):
            err = decode(reply.body, ErrorReply)
            RPC_ERRORS.labels(route, "remote").inc()
            raise RemoteError(err.code, err.message, location=err.location)
        return decode(reply.body, reply_type)

    async def _send(
        self, route: str, body: bytes, type_: str, timeout: float, deadline: float, *, retry: bool
    ) -> AbstractIncomingMessage | None:
        """Publish one request and wait for its reply; None when it should be sent again (see call)."""
        assert self._rpc_exchange is not None
        corr = uuid.uuid4().hex
        fut: asyncio.Future[AbstractIncomingMessage] = asyncio.get_running_loop().create_future()
        self._pending[corr] = fut
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.001)
        msg = aio_pika.Message(
            body,
            content_type=CONTENT_TYPE,
            type=type_,
            correlation_id=corr,
            reply_to=REPLY_TO,
            expiration=remaining,
            delivery_mode=DeliveryMode.NOT_PERSISTENT,
            headers={HEADER_DEADLINE: int((time.time() + remaining) * 1000)},
        )
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    result = await self._rpc_exchange.publish(msg, routing_key=route, mandatory=True)
                except aiormq.exceptions.ChannelPreconditionFailed as exc:
                    if retry and "reply consumer" in str(exc):
                        log.warning("request refused for want of a reply consumer; sending it again", route=route)
                        return None
                    raise self._unavailable(exc) from None
                except BROKER_ERRORS as exc:
                    raise self._unavailable(exc) from None
                if isinstance(result, aiormq.abc.DeliveredMessage):
                    raise NoConsumer(f"no service serves {route!r}: the request was unroutable")
                return await fut
        finally:
            self._pending.pop(corr, None)

    async def _timeout_error(self, route: str, timeout: float) -> VmschedError:
        """Tell "nobody is consuming" apart from "too slow", which the operator fixes differently."""
        queue = self.rpc_queue(route)
        consumers = -1
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                async with self.connection.channel(publisher_confirms=False) as ch:
                    declared = await ch.declare_queue(queue, passive=True)
                    consumers = declared.declaration_result.consumer_count or 0
        if consumers == 0:
            return NoConsumer(f"no service is consuming {queue} (route {route!r})")
        return RpcTimeout(f"no reply to {route!r} within {timeout:g} s")

    # ------------------------------------------------------------------ RPC server
    async def serve(
        self, route: str, request_type: type[Req], handler: Callable[[Req], Awaitable[Message]]
    ) -> Subscription:
        await self._ready(self.settings.rpc_timeout_s)
        try:
            async with asyncio.timeout(self.settings.rpc_timeout_s):
                ch = await self.connection.channel(publisher_confirms=True)
                await ch.set_qos(prefetch_count=self.settings.prefetch)
                exchange = await ch.declare_exchange(self.name(c.RPC_EXCHANGE), ExchangeType.DIRECT, durable=True)
                dlx = await ch.get_exchange(self.name(c.DEAD_LETTER_EXCHANGE), ensure=False)
                queue_name = self.rpc_queue(route)
                queue = await ch.declare_queue(queue_name, durable=True, arguments=self._queue_arguments())
                await queue.bind(exchange, routing_key=route)

                async def on_message(message: AbstractIncomingMessage) -> None:
                    transport = _AmqpTransport(ch, dlx, queue_name, message, self.settings.rpc_timeout_s)
                    await self.dispatcher.request(_delivery(queue_name, message), transport, request_type, handler)

                tag = await queue.consume(on_message)
        except (*BROKER_ERRORS, TimeoutError) as exc:
            raise self._unavailable(exc) from None
        sub = _Consumer(ch, queue, tag)
        self._subscriptions.append(sub)
        return sub

    # ------------------------------------------------------------------ events
    async def publish(self, routing_key: str, event: Message, *, persistent: bool = True) -> None:
        assert self._events is not None
        await self._ready(self.settings.rpc_timeout_s)
        try:
            async with asyncio.timeout(self.settings.rpc_timeout_s):
                await self._events.publish(
                    aio_pika.Message(
                        encode(event),
                        content_type=CONTENT_TYPE,
                        type=type_name(event),
                        delivery_mode=DeliveryMode.PERSISTENT if persistent else DeliveryMode.NOT_PERSISTENT,
                    ),
                    routing_key=routing_key,
                    mandatory=False,
                )
        except TimeoutError:
            raise self._unavailable(f"no confirm within {self.settings.rpc_timeout_s:g} s") from None
        except BROKER_ERRORS as exc:
            raise self._unavailable(exc) from None

    async def subscribe(
        self,
        bindings: Sequence[str],
        models: Sequence[type[Message]],
        handler: Callable[[Any], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        await self._ready(self.settings.rpc_timeout_s)
        by_name = {m.__name__: m for m in models}
        try:
            async with asyncio.timeout(self.settings.rpc_timeout_s):
                ch = await self.connection.channel(publisher_confirms=True)
                await ch.set_qos(prefetch_count=self.settings.prefetch)
                events = await ch.declare_exchange(self.name(c.EVENTS_EXCHANGE), ExchangeType.TOPIC, durable=True)
                dlx = await ch.get_exchange(self.name(c.DEAD_LETTER_EXCHANGE), ensure=False)
                # Own queues dead-letter too: a reject (the last resort) must not drop the message.
                if queue is None:
                    q = await ch.declare_queue(exclusive=True, auto_delete=True, arguments=self._queue_arguments())
                else:
                    q = await ch.declare_queue(self.name(queue), durable=True, arguments=self._queue_arguments())
                for binding in bindings:
                    await q.bind(events, routing_key=binding)
                queue_name = q.name

                async def on_message(message: AbstractIncomingMessage) -> None:
                    transport = _AmqpTransport(ch, dlx, queue_name, message, self.settings.rpc_timeout_s)
                    await self.dispatcher.event(_delivery(queue_name, message), transport, by_name, handler)

                tag = await q.consume(on_message)
        except (*BROKER_ERRORS, TimeoutError) as exc:
            raise self._unavailable(exc) from None
        sub = _Consumer(ch, q, tag)
        self._subscriptions.append(sub)
        return sub

    # ------------------------------------------------------------------ operations
    def is_open(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.is_closed and conn.connected.is_set()

    async def queue_depths(self, queues: Sequence[str]) -> dict[str, int | None]:
        """Passive declares on a plain aiormq channel: one refused for a missing queue closes it
        (NOT_FOUND), and a plain channel is simply replaced, where a robust one would be restored."""
        await self._ready(self.settings.rpc_timeout_s)
        out: dict[str, int | None] = {}
        try:
            async with asyncio.timeout(self.settings.rpc_timeout_s):
                transport = self.connection.transport
                if transport is None:
                    raise ConnectionError("no connection to RabbitMQ")
                amqp = transport.connection
                ch = await amqp.channel()
                try:
                    for queue in queues:
                        try:
                            declared = await ch.queue_declare(self.name(queue), passive=True)
                        except aiormq.exceptions.ChannelNotFoundEntity:
                            out[queue] = None
                            ch = await amqp.channel()
                            continue
                        out[queue] = int(declared.message_count or 0) if declared is not None else None
                finally:
                    with contextlib.suppress(Exception):
                        await ch.close()
        except (*BROKER_ERRORS, TimeoutError) as exc:
            raise self._unavailable(exc) from None
        return out

    async def dead_letters(self, limit: int = 100) -> list[tuple[str, str, bytes]]:
        """Read (without removing) up to `limit` dead letters: (queue, reason, body). For tools and tests."""
        await self._declare_dead_letter_queue()  # same arguments, and the same tolerance of an older queue
        out: list[tuple[str, str, bytes]] = []
        async with self.connection.channel(publisher_confirms=False) as ch:
            q = await ch.declare_queue(self.name(c.DEAD_LETTER_QUEUE), passive=True)
            taken: list[AbstractIncomingMessage] = []
            for _ in range(limit):
                msg = await q.get(fail=False, no_ack=False)
                if msg is None:
                    break
                taken.append(msg)
                out.append(
                    (
                        str(msg.routing_key),
                        str(msg.headers.get(c.HEADER_DLX_REASON, "")),
                        msg.body,
                    )
                )
            for msg in taken:
                await msg.nack(requeue=True)
        return out
