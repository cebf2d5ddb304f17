"""RPC on RabbitMQ: the client side (`RpcClient.call`, reply handling) and the server side (`serve`).

Choices, and why:
* RPC uses RabbitMQ direct reply-to (no reply queue per client; the reply consumer must be on the
  same channel that publishes the requests, in no-ack mode). aio_pika.patterns.RPC is not used:
  it pickles by default.
* A call's timeout bounds everything: the request carries `expiration` (the broker drops it if no
  service took it in time, into the dead-letter exchange) and an `x-deadline-ms` header (a service
  that takes it late does not work on it), and the caller waits at most that long.
* The reply-to consumer is a pseudo-queue that connect_robust does not restore: it is re-registered
  when the publishing channel reopens, and `call` waits (within its timeout) until it is back
  before publishing, because RabbitMQ refuses a request whose reply-to has no consumer by closing
  the channel (PRECONDITION_FAILED - fast reply consumer does not exist).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractRobustChannel,
    DeliveryMode,
    ExchangeType,
)

from vmsched import constants as c
from vmsched.bus.amqp.connection import BROKER_ERRORS, BrokerLink
from vmsched.bus.amqp.consumers import AmqpTransport, Consumer, consumer_channel, delivery_of
from vmsched.bus.base import Subscription
from vmsched.bus.codec import CONTENT_TYPE, decode, encode, type_name
from vmsched.bus.dispatch import Dispatcher, request_headers
from vmsched.contracts import ErrorReply, Message
from vmsched.errors import BusUnavailable, NoConsumer, NotAuthorized, RemoteError, RpcTimeout, VmschedError
from vmsched.logging import get_logger
from vmsched.metrics import RPC_ERRORS, RPC_SECONDS

log = get_logger("vmsched.bus")

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)

REPLY_TO = "amq.rabbitmq.reply-to"


class RpcClient:
    """Calls on the link's publishing channel, their replies taken by one direct reply-to consumer."""

    def __init__(self, link: BrokerLink) -> None:
        self.link = link
        #: The call exchanges by name (without the prefix), taken on the publishing channel.
        self._exchanges: dict[str, AbstractExchange] = {}
        self._pending: dict[str, asyncio.Future[AbstractIncomingMessage]] = {}
        #: Set while the direct reply-to consumer is registered on the open publishing channel.
        self._replies_ready = asyncio.Event()
        #: How many times the reply consumer was registered (a retry waits for a newer one).
        self._reply_generation = 0
        self.reply_tag: str | None = None

    @property
    def channel(self) -> AbstractRobustChannel | None:
        """The channel requests go out on and replies come back to."""
        return self.link.channel

    async def attach(self, ch: AbstractChannel) -> None:
        """Take the call exchanges and register the reply consumer on `ch` (the publishing channel)."""
        self._exchanges = {name: await ch.get_exchange(self.link.name(name), ensure=False) for name in c.RPC_EXCHANGES}
        await self._consume_replies()

    def watch(self, ch: AbstractRobustChannel) -> None:
        """Follow `ch` and the connection: a robust channel restores declared queues, not the
        reply-to pseudo-queue, so it is registered again when the channel reopens."""
        ch.reopen_callbacks.add(self._on_reopen)
        ch.close_callbacks.add(self._on_close)
        self.link.connection.close_callbacks.add(self._on_close)

    def cancel_pending(self) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()

    async def _consume_replies(self) -> None:
        ch = self.channel
        assert ch is not None
        queue = aio_pika.Queue(ch, REPLY_TO, durable=False, exclusive=False, auto_delete=False, arguments=None)
        self.reply_tag = await queue.consume(self._on_reply, no_ack=True)
        self._reply_generation += 1
        self._replies_ready.set()

    async def _on_reopen(self, *_: object) -> None:
        try:
            await self._consume_replies()
        except Exception as exc:
            # Calls wait for the consumer and then raise BusUnavailable; the next reopen tries again.
            log.warning("could not register the reply consumer again", error=repr(exc))

    def _on_close(self, *_: object) -> None:
        self._replies_ready.clear()
        # Replies to calls made on the old channel can never arrive.
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(
                    self.link.unavailable(
                        "the connection was lost while waiting for the reply (it may have been handled)"
                    )
                )

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        fut = self._pending.pop(message.correlation_id or "", None)
        if fut is not None and not fut.done():
            fut.set_result(message)

    async def _wait_for_replies(self, deadline: float, newer_than: int) -> bool:
        """Until the reply consumer is registered (a newer one than `newer_than`), or BusUnavailable at the deadline.

        True if it had to wait (the connection or the publishing channel was being restored).
        """
        loop = asyncio.get_running_loop()
        ch = self.channel
        waited = False
        while not (
            self._replies_ready.is_set() and self._reply_generation > newer_than and ch is not None and not ch.is_closed
        ):
            if self.link.connection.is_closed:
                raise BusUnavailable("the bus is closed")
            if loop.time() >= deadline:
                raise self.link.unavailable("the reply consumer is not registered again yet")
            waited = True
            await asyncio.sleep(0.02)
        return waited

    async def call(self, route: str, request: Message, reply_type: type[Rep], *, timeout: float | None = None) -> Rep:
        timeout = timeout or self.link.settings.rpc_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout
        started = time.perf_counter()
        body = encode(request)
        newer_than = 0
        waited = False
        try:
            while True:
                waited = await self._wait_for_replies(deadline, newer_than) or waited
                generation = self._reply_generation
                reply = await self._send(route, body, type_name(request), deadline, retry=newer_than == 0)
                if reply is not None:
                    break
                newer_than = generation  # refused for want of a reply consumer: wait for a new one, once
        except TimeoutError:
            if waited:
                # The outage took the call's time; "too slow" would send the operator to the wrong place.
                RPC_ERRORS.labels(route, "unavailable").inc()
                raise self.link.unavailable(
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
        except NotAuthorized:
            RPC_ERRORS.labels(route, "refused").inc()
            raise
        RPC_SECONDS.labels(route).observe(time.perf_counter() - started)
        if reply.headers.get(c.HEADER_ERROR):
            err = decode(reply.body, ErrorReply)
            RPC_ERRORS.labels(route, "remote").inc()
            raise RemoteError(err.code, err.message, location=err.location)
        return decode(reply.body, reply_type)

    async def _send(
        self, route: str, body: bytes, type_: str, deadline: float, *, retry: bool
    ) -> AbstractIncomingMessage | None:
        """Publish one request and wait for its reply; None when it should be sent again (see call)."""
        exchange = self._exchanges[c.rpc_exchange(route)]
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
            headers=request_headers(int((time.time() + remaining) * 1000)),
            user_id=self.link.user_id,
        )
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    result = await exchange.publish(msg, routing_key=route, mandatory=True)
                except aiormq.exceptions.ChannelPreconditionFailed as exc:
                    if retry and "reply consumer" in str(exc):
                        log.warning("request refused for want of a reply consumer; sending it again", route=route)
                        return None
                    raise self.link.unavailable(exc) from None
                except aio_pika.exceptions.DeliveryError as exc:
                    self.link.renew_publishing_channel()
                    raise self.link.unavailable(exc) from None
                except aiormq.exceptions.ChannelAccessRefused as exc:
                    raise self.link.refused(exc, f"the call {route!r}") from None
                except BROKER_ERRORS as exc:
                    raise self.link.unavailable(exc) from None
                if isinstance(result, aiormq.abc.DeliveredMessage):
                    raise NoConsumer(f"no service serves {route!r}: the request was unroutable")
                return await fut
        finally:
            self._pending.pop(corr, None)

    async def _timeout_error(self, route: str, timeout: float) -> VmschedError:
        """Tell "nobody is consuming" apart from "too slow", which the operator fixes differently."""
        queue = self.link.rpc_queue(route)
        consumers = -1
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                async with self.link.connection.channel(publisher_confirms=False) as ch:
                    declared = await ch.declare_queue(queue, passive=True)
                    consumers = declared.declaration_result.consumer_count or 0
        if consumers == 0:
            return NoConsumer(f"no service is consuming {queue} (route {route!r})")
        return RpcTimeout(f"no reply to {route!r} within {timeout:g} s")


async def serve(
    link: BrokerLink,
    dispatcher: Dispatcher,
    route: str,
    request_type: type[Req],
    handler: Callable[[Req], Awaitable[Message]],
) -> Subscription:
    """Consume the route's durable queue on a channel of its own, each request through `dispatcher`."""
    bound_s = link.settings.rpc_timeout_s
    await link.ready(bound_s)
    try:
        async with asyncio.timeout(bound_s):
            ch, exchange, dlx = await consumer_channel(link, c.rpc_exchange(route), ExchangeType.DIRECT)
            queue_name = link.rpc_queue(route)
            queue = await link.declare_durable_queue(ch, queue_name)
            if link.declares:
                await queue.bind(exchange, routing_key=route)

            async def on_message(message: AbstractIncomingMessage) -> None:
                transport = AmqpTransport(ch, dlx, queue_name, message, bound_s, link.user_id)
                await dispatcher.request(
                    delivery_of(queue_name, message, link.user_id), transport, request_type, handler
                )

            tag = await queue.consume(on_message)
    except (*BROKER_ERRORS, TimeoutError) as exc:
        raise link.unavailable(exc) from None
    return Consumer(ch, queue, tag, on_message, pausable=True)


__all__ = ["REPLY_TO", "RpcClient", "serve"]
