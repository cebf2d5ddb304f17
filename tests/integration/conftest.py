"""Helpers for integration tests that run services in this process.

A test module defines its own `stack` fixture (which services, which settings), usually as
`async with services(cfg, "state-tracker", ..., bus=buses): yield cfg`; the `client` fixture then
talks to it on the same bus.

Which bus, FastStream-style: a module whose `pytestmark` includes `ON_BOTH_BUSES` runs every test
twice, `test_x[amqp]` on the real RabbitMQ and `test_x[memory]` on one MemoryBroker shared by the
module's services and clients (Redis and PostgreSQL stay real in both). Other modules run on
RabbitMQ only. The memory bus is a drift detector as much as a fast bus: a test that passes on one
and fails on the other has found a difference between AmqpBus and MemoryBus.

Tests of the Redis stores take `keys` (key names no other test uses) and, to count round trips,
`counted` (a Redis client that notes every command it sends); `superseded_lease` gives a fencing
token that a newer one has replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq
import pytest
import redis.asyncio as aioredis

from tests.factories import Certificates, certificates, first_generation, make_cluster, placed_one_at_a_time, vm_spec
from tests.servers import amqp_user
from vmsched import constants as c
from vmsched.bus import Bus, MemoryBroker, MemoryBus, connect
from vmsched.bus.amqp import work_queue_arguments
from vmsched.client import SchedulerClient
from vmsched.contracts import ScheduleDecision
from vmsched.runtime import Runtime
from vmsched.scheduling.hosts import HostTable
from vmsched.settings import Settings
from vmsched.store import ClusterLock, Keys, Lease
from vmsched.store.redis import connect as connect_redis
from vmsched_services.runner import BusFactory, run
from vmsched_services.tools.procs import delete_broker_objects
from vmsched_services.tools.servers.base import TlsListener
from vmsched_services.tools.servers.rabbit import RabbitNode

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

#: How long the services get to start (all of them ready) and to stop.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0

BUS_KINDS = ("amqp", "memory")

#: For a module's `pytestmark`: every test of the module runs on each bus kind, one module-scoped stack per kind.
ON_BOTH_BUSES = pytest.mark.parametrize("bus_kind", BUS_KINDS, indirect=True, scope="module")


@dataclass(frozen=True)
class Buses:
    """The bus every service, runtime and client of a module is given: RabbitMQ, or one shared MemoryBroker."""

    kind: str
    broker: MemoryBroker | None = None

    def __call__(self, settings: Settings, service: str, *, user_id: str | None = None) -> Bus:
        """A bus for `service`; on the memory broker its messages name `user_id` as their sender
        (default: the user of settings.amqp_url, as RabbitMQ vouches for the user a bus connects as)."""
        if self.broker is None:
            return connect(settings, service)
        return MemoryBus(settings, self.broker, service=service, user_id=user_id or amqp_user(settings.amqp_url))

    async def runtime(self, settings: Settings, service: str) -> Runtime:
        """A Runtime of its own (a second selector, a balancer the test drives) on this bus."""
        return await Runtime.open(settings, service=service, bus=self(settings, service))

    @contextlib.asynccontextmanager
    async def client(self, settings: Settings) -> AsyncIterator[SchedulerClient]:
        """A SchedulerClient on this bus, its bus closed (and its subscriptions gone) at the end."""
        async with self(settings, "client") as bus:
            yield SchedulerClient(settings, bus=bus)


@pytest.fixture(scope="module")
def bus_kind(request: pytest.FixtureRequest) -> str:
    """ "amqp", unless the module runs on both buses (ON_BOTH_BUSES)."""
    kind: str = getattr(request, "param", "amqp")
    return kind


@pytest.fixture(scope="module")
def buses(bus_kind: str) -> Buses:
    return Buses(bus_kind, MemoryBroker() if bus_kind == "memory" else None)


@pytest.fixture(scope="module")
def bus_settings(settings: Settings, bus_kind: str) -> Settings:
    """The run's settings with names of this bus kind's own.

    On RabbitMQ they are the run's prefixes (removed at the end of the run, tests/conftest.py). The
    memory stack gets names under them, so its Redis keys (state versions, fencing tokens, leases)
    never meet the RabbitMQ stack's and are still removed with the run's.
    """
    if bus_kind == "amqp":
        return settings
    return settings.model_copy(
        update={
            "amqp_prefix": f"{settings.amqp_prefix}{bus_kind}.",
            "redis_prefix": f"{settings.redis_prefix}:{bus_kind}",
        }
    )


@pytest.fixture
async def client(stack: Settings, buses: Buses) -> AsyncIterator[SchedulerClient]:
    """A SchedulerClient (the engine's side) on the services of the module's `stack`, on the same bus."""
    async with buses.client(stack) as cl:
        yield cl


@pytest.fixture
async def delete_after() -> AsyncIterator[list[Settings]]:
    """Settings whose exchanges and queues go when the test ends: a test that runs services under a
    prefix of its own appends them (each quorum queue left behind weighs on the broker until the
    run's end)."""
    made: list[Settings] = []
    yield made
    for cfg in made:
        await delete_broker_objects(cfg)


@pytest.fixture
def keys(settings: Settings, unique: str) -> Keys:
    """Redis keys of this test alone (under the run's prefix, so they are removed with the run's)."""
    return Keys(f"{settings.redis_prefix}:t-{unique}")


@pytest.fixture
async def counted(settings: Settings) -> AsyncIterator[tuple[aioredis.Redis, list[str]]]:
    """A client that notes the command of every request it writes to Redis: one entry per round trip.

    Counted at the client, not with INFO commandstats: those count every client of the server, and
    other runs and benchmarks use the same Redis.
    """
    sent: list[str] = []

    class Counted(aioredis.Connection):
        async def send_packed_command(self, command: bytes | str | Iterable[bytes], check_health: bool = True) -> None:
            raw = (
                command.encode()
                if isinstance(command, str)
                else b"".join([command] if isinstance(command, bytes) else command)
            )
            sent.append(raw.split(b"\r\n", 3)[2].decode().upper())  # *argc, $len, the command's name
            await super().send_packed_command(command, check_health)

    client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False, connection_class=Counted)
    await client.ping()
    yield client, sent
    await client.aclose()


@contextlib.asynccontextmanager
async def held_lock(cfg: Settings, cluster: str) -> AsyncIterator[Lease]:
    """`cluster`'s lock held by the test for the block (another selector's long group, as it were):
    the requests sent meanwhile queue behind it and are decided together once it is released."""
    redis = connect_redis(cfg)
    try:
        async with ClusterLock(redis, cfg, recover=first_generation(redis, cfg)).hold(cluster) as lease:
            yield lease
    finally:
        await redis.aclose()


async def one_group_against_one_at_a_time(
    client: SchedulerClient, cfg: Settings, cluster: str, unique: str, size: int
) -> tuple[list[ScheduleDecision], Counter[str]]:
    """`size` requests queued behind a held lock on a new cluster of 5 unequal hosts, then decided:
    their decisions, and where the same VMs land placed one at a time (factories.placed_one_at_a_time)."""
    await make_cluster(
        client,
        cluster,
        5,
        cpu_cores=8,
        physical_mem_mb=16_384,
        vary=lambda i: {"mem_free_mb": 6_000 + 2_000 * i, "cpu_usage_pct": 10.0 * i},
    )
    state = await client.state(cluster)
    table = HostTable.from_states(state.hosts, state.settings)
    vms = [vm_spec(f"{unique}-{i}", mem_mb=2048, vcpus=1) for i in range(size)]
    async with held_lock(cfg, cluster):
        sent = [asyncio.create_task(client.schedule(cluster, vm, timeout=30)) for vm in vms]
        await asyncio.sleep(1.0)
        assert not any(t.done() for t in sent)  # all queued behind the lock
    return list(await asyncio.gather(*sent)), await placed_one_at_a_time(table, vms)


async def superseded_lease(locks: ClusterLock, cluster: str) -> tuple[Lease, Lease]:
    """A lease of `cluster` released, and the one acquired after it (still held): writes under the
    first's token are fenced out."""
    stale = await locks.acquire(cluster)
    await locks.release(stale)
    return stale, await locks.acquire(cluster)


@contextlib.asynccontextmanager
async def services(
    cfg: Settings, *names: str, bus: BusFactory | None = None, span_exporter: SpanExporter | None = None
) -> AsyncIterator[Settings]:
    """The named services running in this process on `cfg` (and `bus`, RabbitMQ if None; Buses, or
    any (settings, service) -> Bus) until the block ends; traced into `span_exporter` if given."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(run(list(names), cfg, stop=stop, ready=ready, bus=bus, span_exporter=span_exporter))
    await asyncio.wait_for(ready.wait(), START_TIMEOUT_S)
    try:
        yield cfg
    finally:
        stop.set()
        await asyncio.wait_for(task, STOP_TIMEOUT_S)


async def declared_with(settings: Settings, queue: str, arguments: dict[str, Any]) -> bool:
    """Whether the broker holds the durable `queue` (full name) with exactly these arguments: a
    redeclaration with others is refused, which is how a client tells a queue's type without the
    management plugin."""
    conn = await aio_pika.connect(settings.amqp_url)
    async with conn:
        ch = await conn.channel()
        try:
            await ch.declare_queue(queue, durable=True, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed:
            return False
        return True


async def is_quorum_queue(settings: Settings, queue: str) -> bool:
    """Whether `queue` (full name) is a quorum work queue of ours, as VMSCHED_QUEUE_TYPE=quorum declares it."""
    quorum = settings.model_copy(update={"queue_type": "quorum"})
    dlx = f"{settings.amqp_prefix}{c.DEAD_LETTER_EXCHANGE}"
    return await declared_with(settings, queue, work_queue_arguments(quorum, dlx))


# -------------------------------------------- private servers with TLS (test_tls, test_connection_failures)
@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A CA, server and client certificates it signed, and another CA (tests.factories.certificates)."""
    return certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
async def private_rabbit(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RabbitNode]:
    """One private RabbitMQ node (about 10 s to start, so one per run): a plain listener, and a TLS
    listener that wants a client certificate. Users: alice (password "right", every right on "/"),
    bob (no rights anywhere), carol (may log in to "/", but configure nothing)."""
    tls = TlsListener(certs.server_cert, certs.server_key, certs.ca, client_cert_required=True)
    node = RabbitNode(
        tmp_path_factory.mktemp("rabbit"), f"vmsched-tls-{uuid.uuid4().hex[:6]}@localhost", uuid.uuid4().hex, tls=tls
    )
    try:
        await node.start()
        for user in ("alice", "bob", "carol"):
            await node.ctl("add_user", user, "right")
        await node.ctl("set_permissions", "-p", "/", "alice", ".*", ".*", ".*")
        await node.ctl("set_permissions", "-p", "/", "carol", "^$", ".*", ".*")
        yield node
    finally:
        await node.stop()
        node.reap_group()
