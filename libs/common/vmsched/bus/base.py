"""The bus interface every service and the client use; two implementations share it.

`AmqpBus` (vmsched.bus.amqp) talks to RabbitMQ; `MemoryBus` (vmsched.bus.memory) runs in one
process for fast tests. Both hand every delivery to the same vmsched.bus.dispatch.Dispatcher, so
they give the same guarantees to handlers:

* RPC (`call` / `serve`): request/reply with a correlation id and a timeout that bounds the whole
  call. A handler's domain error (any VmschedError) becomes an ErrorReply with its text (cut to the
  reply's limits), which `call` raises as RemoteError; any other exception becomes code "internal"
  with a reference id that names the full error in the service log. Bad input (undecodable,
  oversized, wrongly typed) is answered with an ErrorReply when it has a reply address *and*
  dead-lettered with the reason; the service keeps serving.
* Events (`publish` / `subscribe`): topic routing keys (constants.py); a subscriber gets decoded
  models; a message its handler cannot process is dead-lettered with the reason, never dropped.
* A handler failing transiently (ConnectionError, OSError, TimeoutError: Redis away) gets its
  message again a bounded number of times, then it is dead-lettered.
* Every delivered message ends acked or rejected (into the dead-letter exchange), never stuck.
* While RabbitMQ cannot be reached, `call`, `publish`, `serve`, `subscribe` and `queue_depths`
  raise BusUnavailable (vmsched.errors) and the bus reconnects by itself.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from vmsched.contracts import Message

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)
Ev = TypeVar("Ev", bound=Message)

RpcHandler = Callable[[Req], Awaitable[Message]]
EventHandler = Callable[[Ev], Awaitable[None]]


@dataclass(frozen=True)
class DeadLetter:
    """A message a service refused, as kept by the dead-letter queue."""

    queue: str
    routing_key: str
    reason: str
    body: bytes
    headers: dict[str, Any]


class Subscription(ABC):
    @abstractmethod
    async def cancel(self) -> None: ...


class Bus(ABC):
    """See the module docstring. Use as `async with bus:` or call start()/close()."""

    service: str = "client"

    async def __aenter__(self) -> Bus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def call(self, route: str, request: Message, reply_type: type[Rep], *, timeout: float | None = None) -> Rep:
        """Send `request` to the service serving `route`; return its reply.

        Raises RpcTimeout, NoConsumer, RemoteError or BusUnavailable (vmsched.errors).
        """

    @abstractmethod
    async def serve(
        self, route: str, request_type: type[Req], handler: Callable[[Req], Awaitable[Message]]
    ) -> Subscription:
        """Answer `route` requests with `handler` (competing with other processes serving it)."""

    @abstractmethod
    async def publish(self, routing_key: str, event: Message, *, persistent: bool = True) -> None:
        """Publish an event on the events exchange (publisher-confirmed)."""

    @abstractmethod
    async def subscribe(
        self,
        bindings: Sequence[str],
        models: Sequence[type[Message]],
        handler: Callable[[Any], Awaitable[None]],
        *,
        queue: str | None = None,
    ) -> Subscription:
        """Receive events matching `bindings` (topic patterns).

        `queue` names a durable queue shared by competing consumers (it survives restarts); None
        gives this process its own exclusive queue that lives as long as the subscription.
        """

    @abstractmethod
    def is_open(self) -> bool:
        """Connected now (started, not closed, not waiting for a lost connection to come back)."""

    @abstractmethod
    async def queue_depths(self, queues: Sequence[str]) -> dict[str, int | None]:
        """Messages waiting in each named queue (names as in vmsched.constants: the bus adds its
        prefix), None for a queue that does not exist. Only messages not yet delivered count: those a
        consumer holds unacknowledged do not. Looks, never declares or consumes.
        """
