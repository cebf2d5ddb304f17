"""The RabbitMQ connection of an AmqpBus: opening it, the topology, waiting out a recovery, and every
broker failure as BusUnavailable.

connect_robust reconnects and restores exchanges, queues and consumers by itself. While the broker
is away every operation raises BusUnavailable (`BrokerLink.unavailable`), never an aio-pika
exception. The shared publishing channel (RPC requests and events) has publisher confirms, so
"published" means the broker took it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustChannel, AbstractRobustConnection, ExchangeType
from yarl import URL

from vmsched import constants as c
from vmsched.bus.codec import safe_text
from vmsched.errors import BusUnavailable
from vmsched.logging import get_logger
from vmsched.settings import Settings

log = get_logger("vmsched.bus")

#: Dead-letter queue bound in messages: old refused messages are dropped first beyond this many.
DLQ_MAX_LENGTH = 100_000
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


class BrokerLink:
    """One robust connection, its publishing channel and the names of the bus's objects on it."""

    def __init__(self, settings: Settings, service: str) -> None:
        self.settings = settings
        self.service = service
        self._conn: AbstractRobustConnection | None = None
        #: The publishing channel (publisher confirms) that RPC requests and events go out on.
        self.channel: AbstractRobustChannel | None = None
        #: False when an older dead-letter queue (declared with other arguments) is used as it is.
        self.dead_letter_queue_bounded = True
        self._dlq_warned = False
        #: Queues of SINGLE_ACTIVE_QUEUES that exist without taking turns (older, used as they are).
        self._competing: set[str] = set()

    def name(self, raw: str) -> str:
        """Exchange and queue names carry the configured prefix (tests isolate runs with it)."""
        return f"{self.settings.amqp_prefix}{raw}"

    def rpc_queue(self, route: str) -> str:
        """The queue a route's servers consume (RPC_QUEUES for the services' routes)."""
        return self.name(c.RPC_QUEUES.get(route, f"vmsched.{route}"))

    def queue_arguments(self) -> dict[str, Any]:
        return {"x-dead-letter-exchange": self.name(c.DEAD_LETTER_EXCHANGE)}

    @property
    def connection(self) -> AbstractRobustConnection:
        if self._conn is None:
            raise RuntimeError("bus not started")
        return self._conn

    def unavailable(self, exc: BaseException | str) -> BusUnavailable:
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {safe_text(exc, 500)}"
        return BusUnavailable(
            f"RabbitMQ at {broker_address(self.settings.amqp_url)} is unreachable: {why}; it reconnects by itself"
        )

    async def open(self, prepare: Callable[[AbstractChannel], Awaitable[None]]) -> AbstractRobustChannel:
        """Connect, open the publishing channel, declare the topology and run `prepare` on the channel
        (the RPC client's and the publisher's exchanges, the reply consumer); BusUnavailable, with
        nothing left open, if any step fails."""
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
            self.channel = ch = await self._conn.channel(publisher_confirms=True)
            await self._declare_topology(ch)
            await prepare(ch)
        except BROKER_ERRORS as exc:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
            raise self.unavailable(exc) from None
        return ch

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    def is_open(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.is_closed and conn.connected.is_set()

    async def ready(self, timeout: float) -> None:
        """Wait (at most `timeout`) for the connection and the publishing channel; BusUnavailable if
        they stay away."""
        conn, ch = self.connection, self.channel
        if conn.is_closed:
            raise BusUnavailable("the bus is closed")
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                await conn.connected.wait()
                if ch is not None:
                    await ch.ready()
        except TimeoutError:
            raise self.unavailable(f"no connection within {timeout:g} s") from None

    def plain_connection(self) -> aiormq.abc.AbstractConnection:
        """The underlying aiormq connection, for throwaway channels a refusal may close (a robust
        channel would be restored instead)."""
        transport = self.connection.transport
        if transport is None:
            raise ConnectionError("no connection to RabbitMQ")
        return transport.connection

    async def _declare_topology(self, ch: AbstractChannel) -> None:
        await ch.declare_exchange(self.name(c.RPC_EXCHANGE), ExchangeType.DIRECT, durable=True)
        await ch.declare_exchange(self.name(c.EVENTS_EXCHANGE), ExchangeType.TOPIC, durable=True)
        await ch.declare_exchange(self.name(c.DEAD_LETTER_EXCHANGE), ExchangeType.TOPIC, durable=True)
        await self.declare_dead_letter_queue()

    async def named_queue_arguments(self, raw: str) -> dict[str, Any]:
        """The arguments to declare the durable queue `raw` with: queue_arguments(), plus a single
        active consumer for SINGLE_ACTIVE_QUEUES. A queue of those that exists without it (declared
        by an older version) is used as it is, with a warning: its consumers then compete, and
        only one of them must run. Probed on a throwaway channel (a refusal closes it)."""
        args = self.queue_arguments()
        name = self.name(raw)
        if raw not in c.SINGLE_ACTIVE_QUEUES or name in self._competing:
            return args
        wanted = {**args, "x-single-active-consumer": True}
        ch = await self.plain_connection().channel()
        try:
            await ch.queue_declare(name, durable=True, arguments=wanted)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            self._competing.add(name)
            log.warning(
                "the queue exists without a single active consumer; using it as it is: run one consumer only",
                queue=name,
                broker_said=str(exc),
                to_migrate=(
                    f"stop its consumers, let it drain, delete it (rabbitmqctl delete_queue {name}) and restart them"
                ),
            )
            return args
        finally:
            with contextlib.suppress(Exception):
                await ch.close()
        return wanted

    async def declare_dead_letter_queue(self) -> None:
        """Declare and bind the dead-letter queue; keep an existing one declared with other arguments.

        A durable queue redeclared with other arguments is refused (PRECONDITION_FAILED) and the
        refusal closes the channel: this runs on throwaway aiormq channels, never the publishing one.
        """
        name = self.name(c.DEAD_LETTER_QUEUE)
        wanted = dead_letter_queue_arguments(self.settings)
        amqp = self.plain_connection()
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


__all__ = ["BROKER_ERRORS", "DLQ_MAX_LENGTH", "BrokerLink", "broker_address", "dead_letter_queue_arguments", "redacted"]
