"""Subscriptions of a client that declares nothing: one consumer on the queue the definitions made
for it (VMSCHED_AMQP_EVENTS_QUEUE, e.g. vmsched.engine.events, already bound to what it may read),
each delivery handed to the subscriptions whose bindings match its routing key.

Several subscriptions cannot each consume the queue: they would compete, and a decision taken by
the `resync_requests` stream would be lost to the `decisions` one. So there is one consumer and the
matching happens here, as the broker would do it for queues of their own. A delivery no
subscription matches right now is acknowledged (the client does not read that kind at the moment;
the queue holds it while no subscription at all is open, so an engine that reconnects reads what
it missed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiormq
from aio_pika.abc import AbstractIncomingMessage, ExchangeType

from vmsched import constants as c
from vmsched.bus.amqp.connection import BrokerLink
from vmsched.bus.amqp.consumers import AmqpTransport, Consumer, consumer_channel, delivery_of
from vmsched.bus.base import Subscription
from vmsched.bus.dispatch import Dispatcher
from vmsched.bus.memory import topic_matches
from vmsched.contracts import Message
from vmsched.errors import BusUnavailable


@dataclass(eq=False)
class _Reader:
    bindings: tuple[str, ...]
    models: dict[str, type[Message]]
    handler: Callable[[Any], Awaitable[None]]

    def reads(self, routing_key: str) -> bool:
        return any(topic_matches(b, routing_key) for b in self.bindings)


class _Share(Subscription):
    def __init__(self, queue: SharedEventQueue, reader: _Reader) -> None:
        self._queue, self._reader = queue, reader

    async def cancel(self) -> None:
        await self._queue.remove(self._reader)

    async def pause(self) -> None:
        """A client's subscriptions are not paused (only services pause consuming while Redis is away)."""

    async def resume(self) -> bool:
        return True


class SharedEventQueue:
    """The one consumer of the client's events queue and the subscriptions reading from it."""

    def __init__(self, link: BrokerLink, dispatcher: Dispatcher) -> None:
        self.link, self.dispatcher = link, dispatcher
        self._readers: list[_Reader] = []
        self._consumer: Consumer | None = None
        self._guard = asyncio.Lock()

    async def add(
        self, bindings: Sequence[str], models: Sequence[type[Message]], handler: Callable[[Any], Awaitable[None]]
    ) -> Subscription:
        reader = _Reader(tuple(bindings), {m.__name__: m for m in models}, handler)
        async with self._guard:
            self._readers.append(reader)
            if self._consumer is None:
                try:
                    self._consumer = await self._consume()
                except BaseException:
                    self._readers.remove(reader)
                    raise
        return _Share(self, reader)

    async def remove(self, reader: _Reader) -> None:
        async with self._guard:
            if reader in self._readers:
                self._readers.remove(reader)
            if not self._readers and self._consumer is not None:
                consumer, self._consumer = self._consumer, None
                await consumer.cancel()

    async def _consume(self) -> Consumer:
        link = self.link
        name = link.name(link.settings.amqp_events_queue)
        ch, _events, dlx = await consumer_channel(link, c.EVENTS_EXCHANGE, ExchangeType.TOPIC)
        try:
            queue = await ch.declare_queue(name, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            raise BusUnavailable(
                f"the events queue {name} (VMSCHED_AMQP_EVENTS_QUEUE) does not exist on the broker: apply the "
                "definitions (`vmsched security apply`) or name the queue made for this client"
            ) from None
        bound_s = link.settings.rpc_timeout_s

        async def on_message(message: AbstractIncomingMessage) -> None:
            delivery = delivery_of(name, message, link.user_id)
            readers = [r for r in self._readers if r.reads(delivery.original_routing_key)]
            if not readers:
                await message.ack()
                return
            models = {n: m for r in readers for n, m in r.models.items()}

            async def handle(event: Message) -> None:
                for r in readers:
                    if type(event).__name__ in r.models:
                        await r.handler(event)

            transport = AmqpTransport(ch, dlx, name, message, bound_s, link.user_id)
            await self.dispatcher.event(delivery, transport, models, handle)

        tag = await queue.consume(on_message)
        return Consumer(ch, queue, tag, on_message, pausable=True)


__all__ = ["SharedEventQueue"]
