"""Consuming on RabbitMQ: each consumer's channel, the dispatcher's primitives on one delivery, and
the handle that cancels a consumer.

What happens to a delivered message (decode, handler, reply, dead letter, retry, ack or reject) is
decided by vmsched.bus.dispatch, shared with MemoryBus; this module only gives it the primitives
(`AmqpTransport`), each publish waiting for the broker's confirm.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    DeliveryMode,
    ExchangeType,
)

from vmsched import constants as c
from vmsched.bus.amqp.connection import BrokerLink
from vmsched.bus.base import Subscription
from vmsched.bus.codec import CONTENT_TYPE
from vmsched.bus.dispatch import HEADER_SENDER, Delivery, Transport
from vmsched.errors import NoConsumer

#: Bound on cancelling a consumer (a robust channel waits for a lost connection to come back).
CANCEL_TIMEOUT_S = 5.0
#: Bound on pausing a consumer whose channel waits for its connection (see Consumer.pause).
PAUSE_OFFLINE_S = 0.01


class AmqpTransport(Transport):
    """The dispatcher's primitives on one delivery; each publish waits for the broker's confirm."""

    def __init__(
        self,
        ch: AbstractChannel,
        dlx: AbstractExchange,
        queue: str,
        message: AbstractIncomingMessage,
        bound_s: float,
        user: str | None = None,
    ) -> None:
        self.ch, self.dlx, self.queue, self.message, self.bound_s = ch, dlx, queue, message, bound_s
        #: The user this service connects as (the retry copy's user_id).
        self.user = user

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
            sender = delivery_of(self.queue, m, self.user).user_id
            result = await self.ch.default_exchange.publish(
                aio_pika.Message(
                    m.body,
                    headers={**headers, HEADER_SENDER: sender or ""},  # "": the original named none
                    user_id=self.user,
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


def delivery_of(queue: str, message: AbstractIncomingMessage, own_user: str | None = None) -> Delivery:
    """What the dispatcher reads of an incoming message. Its sender is its user_id, or on a retry
    copy this service (`own_user`) sent itself, the original sender that copy carries."""
    user_id = message.user_id
    carried = (message.headers or {}).get(HEADER_SENDER)
    if own_user is not None and user_id == own_user and isinstance(carried, str):
        user_id = carried or None
    return Delivery(
        queue=queue,
        body=message.body,
        routing_key=message.routing_key or "",
        headers=dict(message.headers or {}),
        exchange=message.exchange or "",
        type=message.type,
        reply_to=message.reply_to,
        correlation_id=message.correlation_id,
        user_id=user_id,
    )


async def consumer_channel(
    link: BrokerLink, exchange: str, kind: ExchangeType
) -> tuple[AbstractChannel, AbstractExchange, AbstractExchange]:
    """A consumer's own confirmed channel with the bus's prefetch: (channel, `exchange` declared on
    it, the dead-letter exchange)."""
    ch = await link.connection.channel(publisher_confirms=True)
    await ch.set_qos(prefetch_count=link.settings.prefetch)
    declared: AbstractExchange
    if link.declares:
        declared = await ch.declare_exchange(link.name(exchange), kind, durable=True)
    else:
        declared = await ch.get_exchange(link.name(exchange), ensure=False)
    dlx = await ch.get_exchange(link.name(c.DEAD_LETTER_EXCHANGE), ensure=False)
    return ch, declared, dlx


class Consumer(Subscription):
    """One consumer on its own channel. `pausable`: the queue outlives its consumers (an RPC queue, a
    named event queue); an exclusive queue of the process's own is deleted with its last consumer, so
    pausing it would drop its events."""

    def __init__(
        self,
        channel: AbstractChannel,
        queue: AbstractQueue,
        tag: str,
        on_message: Callable[[AbstractIncomingMessage], Awaitable[None]],
        *,
        pausable: bool,
    ) -> None:
        self._channel, self._queue, self._tag = channel, queue, tag
        self._on_message, self._pausable = on_message, pausable
        self._paused = False

    async def cancel(self) -> None:
        # A robust channel whose connection is gone waits for it forever: cancel only a live one, bounded.
        if not self._channel.is_closed and not self._paused:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CANCEL_TIMEOUT_S):
                    await self._queue.cancel(self._tag)
        with contextlib.suppress(Exception):
            await self._channel.close()

    async def pause(self) -> None:
        if self._paused or not self._pausable:
            return
        self._paused = True
        # basic.cancel: RabbitMQ sends nothing more here and gives the queue's messages to the other
        # consumers; the messages in hand stay on this channel, settled as they finish. On a channel
        # waiting for its connection the robust queue forgets the consumer before it waits (so the
        # reconnection does not bring it back), and the short bound ends the wait.
        bound = CANCEL_TIMEOUT_S if not self._channel.is_closed else PAUSE_OFFLINE_S
        with contextlib.suppress(Exception):
            async with asyncio.timeout(bound):
                await self._queue.cancel(self._tag)

    async def resume(self) -> bool:
        if not self._paused:
            return True
        if self._channel.is_closed:
            return False
        try:
            async with asyncio.timeout(CANCEL_TIMEOUT_S):
                self._tag = await self._queue.consume(self._on_message)
        except Exception:
            return False
        self._paused = False
        return True


__all__ = ["CANCEL_TIMEOUT_S", "AmqpTransport", "Consumer", "consumer_channel", "delivery_of"]
