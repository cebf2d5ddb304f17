"""AmqpBus: the Bus on RabbitMQ, put together from its rooms (see the package docstring)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, TypeVar

from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from vmsched.bus.amqp import operations
from vmsched.bus.amqp.connection import BrokerLink
from vmsched.bus.amqp.events import Events
from vmsched.bus.amqp.rpc import RpcClient, serve
from vmsched.bus.base import Bus, DeadLetter, RequeueResult, Subscription
from vmsched.bus.dispatch import Dispatcher
from vmsched.contracts import Message
from vmsched.settings import Settings

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)


class AmqpBus(Bus):
    """One connection (`link`), the RPC client on its publishing channel (`rpc`), the events
    publisher and subscriber (`events`), and the consumers it started (cancelled on close)."""

    def __init__(self, settings: Settings, service: str = "client") -> None:
        self.settings = settings
        self.service = service
        self.dispatcher = Dispatcher(settings, service)
        self.link = BrokerLink(settings, service)
        self.rpc = RpcClient(self.link)
        self.events = Events(self.link, self.dispatcher)
        self._subscriptions: list[Subscription] = []

    def name(self, raw: str) -> str:
        """Exchange and queue names carry the configured prefix (tests isolate runs with it)."""
        return self.link.name(raw)

    def rpc_queue(self, route: str) -> str:
        """The queue a route's servers consume (RPC_QUEUES for the services' routes)."""
        return self.link.rpc_queue(route)

    @property
    def connection(self) -> AbstractRobustConnection:
        return self.link.connection

    @property
    def dead_letter_queue_bounded(self) -> bool:
        """False when an older dead-letter queue (declared with other arguments) is used as it is."""
        return self.link.dead_letter_queue_bounded

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        channel = await self.link.open(self._attach)
        self.rpc.watch(channel)

    async def _attach(self, channel: AbstractChannel) -> None:
        await self.rpc.attach(channel)
        await self.events.attach(channel)

    async def close(self) -> None:
        for sub in self._subscriptions:
            await sub.cancel()
        self._subscriptions.clear()
        self.rpc.cancel_pending()
        await self.link.close()

    def is_open(self) -> bool:
        return self.link.is_open()

    # ------------------------------------------------------------------ RPC
    async def call(self, route: str, request: Message, reply_type: type[Rep], *, timeout: float | None = None) -> Rep:
        return await self.rpc.call(route, request, reply_type, timeout=timeout)

    async def serve(
        self, route: str, request_type: type[Req], handler: Callable[[Req], Awaitable[Message]]
    ) -> Subscription:
        return self._keep(await self._kept(await serve(self.link, self.dispatcher, route, request_type, handler)))

    # ------------------------------------------------------------------ events
    async def publish(
        self, routing_key: str, event: Message, *, persistent: bool = True, message_id: str | None = None
    ) -> None:
        await self.events.publish(routing_key, event, persistent=persistent, message_id=message_id)

    async def subscribe(
        self,
        bindings: Sequence[str],
        models: Sequence[type[Message]],
        handler: Callable[[Any], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        return self._keep(await self._kept(await self.events.subscribe(bindings, models, handler, queue=queue)))

    def _keep(self, sub: Subscription) -> Subscription:
        self._subscriptions.append(sub)
        return sub

    def subscriptions(self) -> Sequence[Subscription]:
        return list(self._subscriptions)

    # ------------------------------------------------------------------ operations
    async def queue_depths(self, queues: Sequence[str]) -> dict[str, int | None]:
        return await operations.queue_depths(self.link, queues)

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        return await operations.dead_letters(self.link, limit)

    async def requeue_dead_letters(self, ids: Collection[str] | None = None) -> RequeueResult:
        return await operations.requeue_dead_letters(self.link, ids)


__all__ = ["AmqpBus"]
