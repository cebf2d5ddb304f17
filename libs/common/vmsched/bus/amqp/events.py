"""Events on RabbitMQ: publishing on the topic exchange and subscribing with a queue of one's own or
a named (shared, durable) one.

Events go out on the link's publishing channel (publisher confirms: "published" means the broker
took it); each subscription consumes on a channel of its own, every delivery through the dispatcher.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage, DeliveryMode, ExchangeType

from vmsched import constants as c
from vmsched.bus.amqp.connection import BROKER_ERRORS, BrokerLink
from vmsched.bus.amqp.consumers import AmqpTransport, Consumer, consumer_channel, delivery_of
from vmsched.bus.amqp.shared_queue import SharedEventQueue
from vmsched.bus.base import Subscription
from vmsched.bus.codec import CONTENT_TYPE, encode, type_name
from vmsched.bus.dispatch import Dispatcher
from vmsched.contracts import Message


class Events:
    """Publish and subscribe on the bus's events exchange."""

    def __init__(self, link: BrokerLink, dispatcher: Dispatcher) -> None:
        self.link = link
        self.dispatcher = dispatcher
        self._exchange: AbstractExchange | None = None
        #: Where subscriptions of their own go when the definitions made a queue for this client.
        self._shared = SharedEventQueue(link, dispatcher)

    async def attach(self, ch: AbstractChannel) -> None:
        """Take the events exchange on `ch` (the publishing channel)."""
        self._exchange = await ch.get_exchange(self.link.name(c.EVENTS_EXCHANGE), ensure=False)

    async def publish(
        self, routing_key: str, event: Message, *, persistent: bool = True, message_id: str | None = None
    ) -> None:
        assert self._exchange is not None
        bound_s = self.link.settings.rpc_timeout_s
        await self.link.ready(bound_s)
        try:
            async with asyncio.timeout(bound_s):
                await self._exchange.publish(
                    aio_pika.Message(
                        encode(event),
                        content_type=CONTENT_TYPE,
                        type=type_name(event),
                        message_id=message_id,
                        user_id=self.link.user_id,
                        delivery_mode=DeliveryMode.PERSISTENT if persistent else DeliveryMode.NOT_PERSISTENT,
                    ),
                    routing_key=routing_key,
                    mandatory=False,
                )
        except TimeoutError:
            raise self.link.unavailable(f"no confirm within {bound_s:g} s") from None
        except aio_pika.exceptions.DeliveryError as exc:
            self.link.renew_publishing_channel()
            raise self.link.unavailable(exc) from None
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise self.link.refused(exc, f"publishing {routing_key!r}") from None
        except BROKER_ERRORS as exc:
            raise self.link.unavailable(exc) from None

    async def subscribe(
        self,
        bindings: Sequence[str],
        models: Sequence[type[Message]],
        handler: Callable[[Any], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        link = self.link
        bound_s = link.settings.rpc_timeout_s
        await link.ready(bound_s)
        by_name = {m.__name__: m for m in models}
        if queue is None and link.settings.amqp_events_queue:
            try:
                async with asyncio.timeout(bound_s):
                    return await self._shared.add(bindings, models, handler)
            except aiormq.exceptions.ChannelAccessRefused as exc:
                raise link.refused(exc, f"reading {link.settings.amqp_events_queue}") from None
            except (*BROKER_ERRORS, TimeoutError) as exc:
                raise link.unavailable(exc) from None
        try:
            async with asyncio.timeout(bound_s):
                ch, events, dlx = await consumer_channel(link, c.EVENTS_EXCHANGE, ExchangeType.TOPIC)
                # Own queues dead-letter too: a reject (the last resort) must not drop the message.
                # An own queue is exclusive, so classic (a quorum queue cannot be): it lives and dies
                # with this connection anyway; named queues have the configured type.
                if queue is None:
                    own = link.name(c.own_queue(link.service, uuid.uuid4().hex[:16]))
                    q = await ch.declare_queue(own, exclusive=True, auto_delete=True, arguments=link.queue_arguments())
                else:
                    q = await link.declare_durable_queue(
                        ch, link.name(queue), single_active=queue in c.SINGLE_ACTIVE_QUEUES
                    )
                if queue is None or link.declares:
                    for binding in bindings:
                        await q.bind(events, routing_key=binding)
                queue_name = q.name

                async def on_message(message: AbstractIncomingMessage) -> None:
                    transport = AmqpTransport(ch, dlx, queue_name, message, bound_s, self.link.user_id)
                    await self.dispatcher.event(
                        delivery_of(queue_name, message, self.link.user_id), transport, by_name, handler
                    )

                tag = await q.consume(on_message)
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise link.refused(exc, f"subscribing to {list(bindings)}") from None
        except (*BROKER_ERRORS, TimeoutError) as exc:
            raise link.unavailable(exc) from None
        return Consumer(ch, q, tag, on_message, pausable=queue is not None)


__all__ = ["Events"]
