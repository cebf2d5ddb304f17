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
* The dead-letter queue can be read (`dead_letters`: why, by whom, where each message was going)
  and its messages sent again where they were first published (`requeue_dead_letters`), for
  `vmsched dead-letters`.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from vmsched import constants as c
from vmsched.bus.dispatch import (
    HEADER_ATTEMPTS,
    HEADER_DEADLINE,
    HEADER_ORIGINAL_SIZE,
    HEADER_SENDER,
    HEADER_TRUNCATED,
    Dispatcher,
    Recogniser,
)
from vmsched.contracts import Message

Req = TypeVar("Req", bound=Message)
Rep = TypeVar("Rep", bound=Message)
Ev = TypeVar("Ev", bound=Message)

RpcHandler = Callable[[Req], Awaitable[Message]]
EventHandler = Callable[[Ev], Awaitable[None]]


#: Headers a dead letter carries about its refusal (vmsched's own and the broker's): a requeued
#: message goes out without them, and with its transient attempts counted from zero again.
_BOOKKEEPING_HEADERS = frozenset(
    {
        c.HEADER_DLX_REASON,
        c.HEADER_DLX_SERVICE,
        c.HEADER_DLX_ROUTING_KEY,
        c.HEADER_DLX_EXCHANGE,
        c.HEADER_DLX_TIME,
        c.HEADER_DLX_ID,
        HEADER_ATTEMPTS,
        HEADER_SENDER,
        HEADER_ORIGINAL_SIZE,
        HEADER_TRUNCATED,
        HEADER_DEADLINE,
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
    }
)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class DeadLetter:
    """A message a service (or the broker) refused, as kept by the dead-letter queue.

    Two kinds end up there: copies a service made (vmsched.bus.dispatch.dead_letter_copy: the reason,
    service, original exchange and routing key, time and an id in x-vmsched-* headers), and messages
    the broker dead-lettered itself (a reject, an expired request, an overflowing queue), described
    by its x-death header. `parse` reads both.
    """

    #: The queue that refused it.
    queue: str
    #: The routing key it was published with.
    routing_key: str
    reason: str
    body: bytes
    headers: dict[str, Any]
    #: The exchange it was published to ("" the default exchange); None when not recorded.
    exchange: str | None = None
    #: Who refused it: a vmsched service's name, or "broker".
    service: str = ""
    dead_lettered_at: datetime | None = None
    #: Stable across reads: the id the refusing service gave it, else a digest of what it holds.
    id: str = ""
    #: The message's `type` property (the model's name): event queues decode by it.
    type: str | None = None

    @classmethod
    def parse(
        cls, dlx_routing_key: str, body: bytes, headers: Mapping[str, Any], type_: str | None = None
    ) -> DeadLetter:
        """A dead letter from its dead-letter-exchange routing key, body, headers and type property."""
        h = dict(headers)
        death = _first_death(h.get("x-death"))
        if c.HEADER_DLX_REASON in h:
            queue, routing_key = dlx_routing_key, _text(h.get(c.HEADER_DLX_ROUTING_KEY, ""))
            reason, service = _text(h[c.HEADER_DLX_REASON]), _text(h.get(c.HEADER_DLX_SERVICE, ""))
            exchange = _text(h[c.HEADER_DLX_EXCHANGE]) if c.HEADER_DLX_EXCHANGE in h else None
            ms = h.get(c.HEADER_DLX_TIME)
            when = datetime.fromtimestamp(ms / 1000, UTC) if isinstance(ms, int) and not isinstance(ms, bool) else None
        elif death is not None:
            keys = death.get("routing-keys") or [dlx_routing_key]
            queue, routing_key = _text(death.get("queue", "")), _text(keys[0])
            reason, service = f"{_text(death.get('reason', 'dead-lettered'))} by the broker", "broker"
            exchange = _text(death["exchange"]) if "exchange" in death else None
            when = death.get("time") if isinstance(death.get("time"), datetime) else None
        else:
            queue, routing_key, reason, service, exchange, when = dlx_routing_key, dlx_routing_key, "", "", None, None
        if when is not None and when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        ident = _text(h[c.HEADER_DLX_ID]) if c.HEADER_DLX_ID in h else ""
        if not ident:
            seen = f"{queue}\0{routing_key}\0{reason}\0{when}\0".encode() + body
            ident = hashlib.sha256(seen).hexdigest()[: c.DEAD_LETTER_ID_LENGTH]
        return cls(queue, routing_key, reason, body, h, exchange, service, when, ident, type_)

    @property
    def truncated(self) -> bool:
        return bool(self.headers.get(HEADER_TRUNCATED))

    def unrequeueable(self, exchanges: Collection[str]) -> str | None:
        """Why this message cannot be sent again to where it was going (None if it can), given the
        exchanges a requeue may publish to."""
        if self.truncated:
            return "its body was cut when it was dead-lettered"
        if self.exchange is None:
            return "its original exchange was not recorded"
        if self.exchange not in exchanges:
            return f"its original exchange {self.exchange!r} is not one of vmsched's"
        if self.exchange == "" and not self.routing_key:
            return "its original routing key was not recorded"
        return None

    def requeue_headers(self) -> dict[str, Any]:
        """The message's own headers, without what its refusal added."""
        return {k: v for k, v in self.headers.items() if k not in _BOOKKEEPING_HEADERS}


def _first_death(value: Any) -> dict[str, Any] | None:
    """The newest x-death entry (RabbitMQ puts it first), if the header holds one."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return {_text(k): v for k, v in value[0].items()}
    return None


@dataclass(frozen=True)
class RequeueResult:
    """What `Bus.requeue_dead_letters` did: ids sent back, and the ids left in the queue with why."""

    requeued: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class Subscription(ABC):
    @abstractmethod
    async def cancel(self) -> None: ...

    @abstractmethod
    async def pause(self) -> None:
        """Stop taking messages (basic.cancel: the broker gives them to the queue's other consumers)
        and keep settling those in hand; a subscription to a queue of its own, which would go with its
        last consumer, keeps consuming."""

    @abstractmethod
    async def resume(self) -> bool:
        """Take messages again after pause(); False when that could not be done now (try again)."""


class Bus(ABC):
    """See the module docstring. Use as `async with bus:` or call start()/close()."""

    service: str = "client"
    dispatcher: Dispatcher
    #: Set while pause_consuming() holds: subscriptions made then start paused.
    paused: bool = False

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
    async def publish(
        self, routing_key: str, event: Message, *, persistent: bool = True, message_id: str | None = None
    ) -> None:
        """Publish an event on the events exchange (publisher-confirmed). `message_id`: the event's
        identity for subscribers that drop repeats (AMQP message_id, a new one when None; the in-memory
        bus has none)."""

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

        `queue` names a durable queue shared by competing consumers (it survives restarts), or by
        consumers taking turns for the queues of constants.SINGLE_ACTIVE_QUEUES (on RabbitMQ; the
        in-memory bus has one consumer per queue in practice); None gives this process its own
        exclusive queue that lives as long as the subscription.
        """

    async def pause_consuming(self) -> None:
        """Pause every subscription (see Subscription.pause), those made later too, until
        resume_consuming(): the wiring does it while a server the services need is away."""
        self.paused = True
        for sub in self.subscriptions():
            await sub.pause()

    async def resume_consuming(self) -> bool:
        """Resume every subscription; False when one could not be resumed yet (the bus stays
        paused, so the next call tries again; those resumed already stay resumed)."""
        resumed = True
        for sub in self.subscriptions():
            resumed = await sub.resume() and resumed
        self.paused = not resumed
        return resumed

    async def _kept(self, sub: Subscription) -> Subscription:
        """A new subscription, paused at once while the bus is."""
        if self.paused:
            await sub.pause()
        return sub

    @abstractmethod
    def subscriptions(self) -> Sequence[Subscription]:
        """The subscriptions this bus made that are not cancelled."""

    def recognise(self, *recognisers: Recogniser) -> None:
        """Also treat what these say is a server being away as transient (vmsched.bus.dispatch)."""
        self.dispatcher.recognise(*recognisers)

    @abstractmethod
    def is_open(self) -> bool:
        """Connected now (started, not closed, not waiting for a lost connection to come back)."""

    @abstractmethod
    async def queue_depths(self, queues: Sequence[str]) -> dict[str, int | None]:
        """Messages waiting in each named queue (names as in vmsched.constants: the bus adds its
        prefix), None for a queue that does not exist. Only messages not yet delivered count: those a
        consumer holds unacknowledged do not. Looks, never declares or consumes.
        """

    # ------------------------------------------------------------------ operations (the dead-letter queue)
    @abstractmethod
    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Up to `limit` dead letters, oldest first, left in the queue."""

    @abstractmethod
    async def requeue_dead_letters(self, ids: Collection[str] | None = None) -> RequeueResult:
        """Publish the dead letters with these ids (None: every one) again to the exchange and
        routing key they were first published to, and remove them from the dead-letter queue.

        Only messages whose destination is known and whose body is whole are sent; the others stay,
        in `skipped` with why. An id not found is left out of both.
        """
