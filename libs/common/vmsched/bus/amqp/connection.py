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

import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
    ExchangeType,
)
from yarl import URL

from vmsched import constants as c
from vmsched.bus.amqp.failures import connect_failure, refused
from vmsched.bus.amqp.nodes import FailoverConnection, connect_failover
from vmsched.bus.codec import safe_text
from vmsched.errors import BusUnavailable, NotAuthorized
from vmsched.logging import get_logger
from vmsched.settings import Settings, redacted_url

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
        **queue_type_arguments(settings),
        "x-max-length": DLQ_MAX_LENGTH,
        "x-max-length-bytes": settings.dead_letter_queue_max_bytes,
        "x-overflow": "drop-head",
    }


def queue_type_arguments(settings: Settings) -> dict[str, Any]:
    """What makes a durable queue of ours the configured type (nothing for classic, so queues
    declared before the setting existed are equivalent to classic ones)."""
    return {"x-queue-type": "quorum"} if settings.queue_type == "quorum" else {}


def work_queue_arguments(settings: Settings, dead_letter_exchange: str) -> dict[str, Any]:
    """A durable work or event queue's arguments: its type, its dead-letter exchange and, for a
    quorum queue, dead-lettering at least once (what the broker dead-letters itself, a request
    expired or a message rejected, stays in the queue until the dead-letter queue confirmed it;
    the broker accepts that strategy only with reject-publish overflow, and these queues have no
    length limit for it to apply to)."""
    args: dict[str, Any] = {**queue_type_arguments(settings), "x-dead-letter-exchange": dead_letter_exchange}
    if settings.queue_type == "quorum":
        args |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    return args


def redacted(url: str) -> str:
    """The AMQP URL without its password, for messages and logs."""
    return redacted_url(url)


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
        #: The background reopening of the publishing channel after a nack, and when it last began.
        self._renewing: asyncio.Task[None] | None = None
        self._renewed_at = float("-inf")
        #: (node URL, its user): user_id's cache.
        self._user_of: tuple[str, str | None] = ("", None)

    def name(self, raw: str) -> str:
        """Exchange and queue names carry the configured prefix (tests isolate runs with it)."""
        return f"{self.settings.amqp_prefix}{raw}"

    def rpc_queue(self, route: str) -> str:
        """The queue a route's servers consume (RPC_QUEUES for the services' routes)."""
        return self.name(c.rpc_queue(route))

    def queue_arguments(self) -> dict[str, Any]:
        """The arguments of a connection's own (exclusive, so always classic) queue."""
        return {"x-dead-letter-exchange": self.name(c.DEAD_LETTER_EXCHANGE)}

    def durable_queue_arguments(self) -> dict[str, Any]:
        """The arguments of a durable work or event queue (see work_queue_arguments)."""
        return work_queue_arguments(self.settings, self.name(c.DEAD_LETTER_EXCHANGE))

    @property
    def connection(self) -> AbstractRobustConnection:
        if self._conn is None:
            raise RuntimeError("bus not started")
        return self._conn

    @property
    def user_id(self) -> str | None:
        """The AMQP user the connection logs in as, put on every request and event published as the
        `user_id` property: RabbitMQ refuses a publish whose user_id is another user's, so a
        receiver can trust it (None when the URL names no user, e.g. a certificate's identity).
        Read off the node's URL once per node, not on every publish."""
        url = self.node_url
        if self._user_of[0] != url:
            try:
                user = URL(url).user or None
            except Exception:
                user = None
            self._user_of = (url, user)
        return self._user_of[1]

    @property
    def declares(self) -> bool:
        """False: use exchanges and queues as the definitions made them, declaring nothing."""
        return self.settings.amqp_declare

    @property
    def node_url(self) -> str:
        """The node the connection is on (or was last tried), amqp_url before connecting."""
        conn = self._conn
        return str(conn.url) if isinstance(conn, FailoverConnection) else self.settings.amqp_url

    def refused(self, exc: BaseException, what: str) -> NotAuthorized:
        """The broker refused `what` for want of permission (ACCESS_REFUSED): not retryable."""
        return NotAuthorized(
            f"RabbitMQ refused {what} for user {self.user_id or '(from the certificate)'}: {safe_text(exc, 300)}; "
            "this user's permissions do not allow it (docs/security.md lists what each role may do)"
        )

    def unavailable(self, exc: BaseException | str) -> BusUnavailable:
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {safe_text(exc, 500)}"
        return BusUnavailable(
            f"RabbitMQ at {broker_address(self.node_url)} is unreachable: {why}; it reconnects by itself"
        )

    async def open(self, prepare: Callable[[AbstractChannel], Awaitable[None]]) -> AbstractRobustChannel:
        """Connect, open the publishing channel, declare the topology and run `prepare` on the channel
        (the RPC client's and the publisher's exchanges, the reply consumer); BusUnavailable, with
        nothing left open, if any step fails."""
        try:
            self._conn = await connect_failover(
                self.settings,
                client_properties={"connection_name": f"vmsched-{self.service}"},
                reconnect_interval=self.settings.amqp_reconnect_interval_s,
                timeout=self.settings.rpc_timeout_s,
            )
        except (*BROKER_ERRORS, TimeoutError) as exc:
            # Named for what it is (the login, rights, TLS, another server, nothing there, away).
            raise await connect_failure(self.settings, exc) from None
        try:
            self.channel = ch = await self._conn.channel(publisher_confirms=True)
            if self.declares:
                await self._declare_topology(ch)
            await prepare(ch)
        except BROKER_ERRORS as exc:
            with contextlib.suppress(Exception):
                await self._conn.close()
            self._conn = None
            raise refused(self.settings, self.node_url, exc) or self.unavailable(exc) from None
        return ch

    def renew_publishing_channel(self) -> None:
        """After a publish the broker refused (nack): reopen the publishing channel, at most once
        per reconnect interval, in the background.

        A channel RabbitMQ 3.10 opened while a quorum queue was electing its new leader can keep
        the old leader and nack every later publish to that queue, for good; a new channel looks
        the leader up afresh. The robust channel reopens by itself when its underlying channel
        closes (the reply consumer is registered again, calls waiting on the old one fail
        retryably).
        """
        ch = self.channel
        now = asyncio.get_running_loop().time()
        if ch is None or self._renewing is not None or now < self._renewed_at + self.settings.amqp_reconnect_interval_s:
            return
        self._renewed_at = now

        async def renew() -> None:
            try:
                underlay = await ch.get_underlay_channel()
                await underlay.close()
            except Exception as exc:  # the connection's own recovery takes over
                log.debug("could not reopen the publishing channel", error=repr(exc))
            finally:
                self._renewing = None

        log.warning("a publish was refused (nack); reopening the publishing channel")
        self._renewing = asyncio.create_task(renew())

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
        for exchange in c.RPC_EXCHANGES:
            await ch.declare_exchange(self.name(exchange), ExchangeType.DIRECT, durable=True)
        await ch.declare_exchange(self.name(c.EVENTS_EXCHANGE), ExchangeType.TOPIC, durable=True)
        await ch.declare_exchange(self.name(c.DEAD_LETTER_EXCHANGE), ExchangeType.TOPIC, durable=True)
        await self.declare_dead_letter_queue()

    async def declare_durable_queue(
        self, ch: AbstractChannel, name: str, *, single_active: bool = False, always: bool = False
    ) -> AbstractQueue:
        """Declare the durable work or event queue `name` on `ch` (durable_queue_arguments; with
        `single_active`, its consumers take turns: one consumes, the others stand by).

        One that exists with other arguments (the other queue type: VMSCHED_QUEUE_TYPE changed
        since it was declared; or declared by an older version without taking turns) is used as it
        is, with a warning saying how to convert it, rather than refused: its messages stay and the
        services run (where consumers should take turns, run one only). The arguments are tried
        first on a throwaway channel, because a refusal closes the channel it came on.

        `always`: declared even under VMSCHED_AMQP_DECLARE=false, for a queue no definitions can
        make in advance (a catalogue route's, named after the worker's unit catalogue); such a queue
        also expires once unused for constants.CATALOGUE_QUEUE_EXPIRES_MS.
        """
        wanted = self.durable_queue_arguments()
        if single_active:
            wanted["x-single-active-consumer"] = True
        if always:
            wanted["x-expires"] = c.CATALOGUE_QUEUE_EXPIRES_MS
        if not (self.declares or always):
            return await ch.declare_queue(name, passive=True)
        probe = await self.plain_connection().channel()
        try:
            await probe.queue_declare(name, durable=True, arguments=wanted)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            log.warning(
                "the queue exists with other arguments (another queue type, or no single active consumer); "
                "using it as it is",
                queue=name,
                broker_said=str(exc),
                wanted=wanted,
                to_convert=(
                    f"stop the services consuming it, wait until it is empty (rabbitmqctl list_queues name "
                    f"messages), delete it (rabbitmqctl delete_queue {name}) and start them again"
                ),
            )
            return await ch.declare_queue(name, passive=True)
        finally:
            with contextlib.suppress(Exception):
                await probe.close()
        return await ch.declare_queue(name, durable=True, arguments=wanted)

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
            # A policy cannot set a queue's type: only the bounds go into it.
            policy = json.dumps({k.removeprefix("x-"): v for k, v in wanted.items() if k != "x-queue-type"})
            (log.debug if self._dlq_warned else log.warning)(
                "the dead-letter queue exists with other arguments (an older bound, or another queue type); "
                "using it as it is",
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


__all__ = [
    "BROKER_ERRORS",
    "DLQ_MAX_LENGTH",
    "BrokerLink",
    "broker_address",
    "dead_letter_queue_arguments",
    "queue_type_arguments",
    "redacted",
    "work_queue_arguments",
]
