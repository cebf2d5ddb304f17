"""Who may administer: every policy write, removal and requeue is refused unless its sender (the AMQP
user_id the broker vouches for) is named in VMSCHED_ADMIN_USERS, and the state tracker takes removal
events only from an administrator or VMSCHED_POLICY_ADMIN_USER. A refusal says who asked and what to
do, and changes nothing.

The identities are varied on a MemoryBroker (each bus stamps its own user_id, as RabbitMQ vouches for
the user each connection logged in as): the shared RabbitMQ has one user, guest. On it, a
policy-admin whose administrators do not include guest shows the real broker's user_id refused,
through the `vmsched` command too. PostgreSQL and Redis are real in both.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests import factories
from tests.e2e.cli import run_program
from tests.integration.conftest import services
from vmsched import constants as c
from vmsched.bus import Bus, MemoryBroker, MemoryBus
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterRemoved, HostRemoved, PolicySet
from vmsched.db import connect as connect_pg
from vmsched.db import migrate
from vmsched.db.audit import AuditLog
from vmsched.errors import RemoteError
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched_services.tools.cli import EXIT_ERROR
from vmsched_services.tools.procs import settings_env

pytestmark = pytest.mark.integration

ADMIN = "root-admin"
ENGINE = "vmsched-engine"
POLICY_ADMIN = "vmsched-policy-admin"
VMSCHED = (sys.executable, "-m", "vmsched_services.tools.cli")
ADMINS = "VMSCHED_ADMIN_USERS"
NOT_ADMIN = f"is not an administrator: policy changes need a user named in {ADMINS}"


@dataclass
class World:
    """Services on one MemoryBroker, each bus with its own identity, and how to talk to them as anyone."""

    settings: Settings
    broker: MemoryBroker

    def bus(self, user: str | None) -> Bus:
        return MemoryBus(self.settings, self.broker, service="client", user_id=user)

    @contextlib.asynccontextmanager
    async def admin(self, user: str | None) -> AsyncIterator[PolicyClient]:
        async with self.bus(user) as bus:
            yield PolicyClient(self.settings, bus=bus)

    @contextlib.asynccontextmanager
    async def engine(self, user: str | None = ENGINE) -> AsyncIterator[SchedulerClient]:
        async with self.bus(user) as bus:
            yield SchedulerClient(self.settings, bus=bus)


def _as(broker: MemoryBroker, user: str) -> Callable[[Settings, str], Bus]:
    return lambda settings, service: MemoryBus(settings, broker, service=service, user_id=user)


@pytest.fixture(scope="module")
async def world(settings: Settings, database: str) -> AsyncIterator[World]:
    await migrate(database)
    cfg = settings.model_copy(
        update={
            "postgres_url": database,
            "amqp_prefix": f"{settings.amqp_prefix}authz.",
            "redis_prefix": f"{settings.redis_prefix}:authz",
            "admin_users": ADMIN,
            "policy_admin_user": POLICY_ADMIN,
        }
    )
    broker = MemoryBroker()
    async with (
        services(cfg, "state-tracker", "filter-worker", bus=_as(broker, "vmsched-state-tracker")),
        services(cfg, "policy-admin", bus=_as(broker, POLICY_ADMIN)),
    ):
        yield World(cfg, broker)


async def _refused(call: Awaitable[Any]) -> str:
    with pytest.raises(RemoteError) as info:
        await call
    assert info.value.remote_code == "not_authorized"
    return str(info.value)


async def _actors(world: World) -> set[str]:
    pool = await connect_pg(world.settings.postgres_url)
    try:
        return {row.actor for row in await AuditLog(pool).read(10_000)}
    finally:
        await pool.close()


WRITES: dict[str, Callable[[PolicyClient, str], Awaitable[Any]]] = {
    "apply": lambda admin, name: admin.apply(PolicySet()),
    "clone": lambda admin, name: admin.clone("none", name),
    "delete": lambda admin, name: admin.delete("none"),
    "detach": lambda admin, name: admin.detach(name),
    "rollback": lambda admin, name: admin.rollback("none"),
    "requeue": lambda admin, name: admin.requeue_dead_letters(None),
}


@pytest.mark.parametrize("write", list(WRITES))
async def test_every_write_by_a_user_not_named_is_refused_saying_who_and_what_to_do(
    world: World, write: str, unique: str
) -> None:
    async with world.admin(ENGINE) as engine_user:
        text = await _refused(WRITES[write](engine_user, f"w-{unique}"))
    assert text.startswith(f"AMQP user '{ENGINE}' is not an administrator: ")
    assert "a user named in VMSCHED_ADMIN_USERS" in text
    if write != "requeue":
        assert text == f"AMQP user '{ENGINE}' {NOT_ADMIN}"
    assert ENGINE not in await _actors(world)


async def test_a_request_that_names_no_sender_is_refused(world: World, unique: str) -> None:
    async with world.admin(None) as anonymous:
        text = await _refused(anonymous.clone("none", f"anon-{unique}"))
        assert text.startswith("the request names no sender (AMQP user_id): policy changes need a user named in")
        assert f"anon-{unique}" not in {p.document.name for p in (await anonymous.read()).policies}


async def test_reads_and_dry_runs_need_no_administrator(world: World) -> None:
    async with world.admin(ENGINE) as engine_user:
        none = (await engine_user.read(["none"])).policies[0]
        assert [v.version for v in (await engine_user.history("none")).versions] == [none.version]
        assert (await engine_user.units()).units
        await engine_user.audit(limit=1)
        dry = await engine_user.apply(PolicySet(policies=[none.document]), dry_run=True)
        assert dry.dry_run


async def test_removals_asked_by_a_user_not_named_are_refused_and_the_state_stays(world: World, unique: str) -> None:
    cluster = f"keep-{unique}"
    async with world.engine() as engine:
        await factories.make_cluster(engine, cluster, 2, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)
        hosts = await _refused(engine.remove_hosts(cluster, ["h1"]))
        assert hosts == f"AMQP user '{ENGINE}' is not an administrator: removing hosts needs a user named in {ADMINS}"
        gone = await _refused(engine.remove_cluster(cluster))
        assert gone.startswith(f"AMQP user '{ENGINE}' is not an administrator: removing a cluster needs")
        assert len((await engine.state(cluster)).hosts) == 2


async def test_removal_events_from_a_user_not_named_are_dead_lettered_with_why(world: World, unique: str) -> None:
    cluster = f"forged-{unique}"
    async with world.engine() as engine:
        await factories.make_cluster(engine, cluster, 2, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)
        # An engine's credentials publishing the events itself, past policy-admin.
        await engine.bus.publish(c.host_removed_key(cluster), HostRemoved(cluster_id=cluster, host_ids=["h1"]))
        await engine.bus.publish(c.cluster_removed_key(cluster), ClusterRemoved(cluster_id=cluster))

        async def refused() -> dict[str, str]:
            return {d.id: d.reason or "" for d in world.broker.dead_letters if d.routing_key.endswith(f".{cluster}")}

        reasons = await factories.eventually(refused, lambda found: len(found) == 2)
        assert all(f"AMQP user '{ENGINE}' is not an administrator: removals need" in r for r in reasons.values())
        assert all("VMSCHED_ADMIN_USERS or VMSCHED_POLICY_ADMIN_USER" in r for r in reasons.values())
        assert len((await engine.state(cluster)).hosts) == 2

        # An administrator requeueing them does not vouch for them: they go out naming no sender
        # and are refused again.
        async with world.admin(ADMIN) as admin:
            assert sorted((await admin.requeue_dead_letters(list(reasons))).requeued) == sorted(reasons)
        again = await factories.eventually(refused, lambda found: len(found) == 2 and not set(found) & set(reasons))
        assert all(r.startswith("the event names no sender (AMQP user_id): removals need") for r in again.values())
        assert len((await engine.state(cluster)).hosts) == 2


async def test_an_administrator_removes_through_policy_admin_and_the_tracker_applies_it(
    world: World, unique: str
) -> None:
    cluster = f"gone-{unique}"
    async with world.engine() as engine, world.engine(ADMIN) as admin:
        h0, h1, h2 = await factories.make_cluster(
            engine, cluster, 3, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192
        )
        removal = await admin.remove_hosts(cluster, [h1], reason="decommissioned")
        assert removal.host_ids == [h1]

        async def hosts() -> list[str]:
            return [h.report.host_id for h in (await engine.state(cluster)).hosts]

        assert await factories.eventually(hosts, lambda found: h1 not in found) == [h0, h2]
        # An administrator's own event is taken as well (VMSCHED_ADMIN_USERS).
        await admin.bus.publish(c.host_removed_key(cluster), HostRemoved(cluster_id=cluster, host_ids=[h2]))
        assert await factories.eventually(hosts, lambda found: h2 not in found) == [h0]
    assert {ADMIN} <= await _actors(world)


# ---------------------------------------------------------------------------------- RabbitMQ
@pytest.fixture(scope="module")
async def guarded(settings: Settings, database: str) -> AsyncIterator[Settings]:
    """policy-admin on the shared RabbitMQ, administered by a user other than the tests' own (guest)."""
    await migrate(database)
    cfg = settings.model_copy(update={"postgres_url": database, "admin_users": "vmsched-admin"})
    async with services(cfg, "policy-admin"):
        yield cfg


async def test_on_rabbitmq_the_connections_user_is_the_one_refused(guarded: Settings, unique: str) -> None:
    async with PolicyClient(guarded) as admin:
        text = await _refused(admin.clone("none", f"rmq-{unique}"))
    assert text == f"AMQP user 'guest' {NOT_ADMIN}"


async def test_the_command_says_the_refusal_and_what_to_do_and_exits_3(guarded: Settings, unique: str) -> None:
    env = settings_env(guarded)
    code, _, err = await run_program(*VMSCHED, "policy", "clone", "none", f"cli-{unique}", env=env, timeout=60)
    assert code == EXIT_ERROR
    assert f"vmsched policy: not_authorized: AMQP user 'guest' {NOT_ADMIN}" in err
    assert "point VMSCHED_AMQP_URL at a RabbitMQ user named in the services' VMSCHED_ADMIN_USERS" in err

    code, _, err = await run_program(*VMSCHED, "dead-letters", "requeue", "--all", "--yes", env=env, timeout=60)
    assert code == EXIT_ERROR
    assert err.startswith("vmsched: not_authorized: AMQP user 'guest' is not an administrator: requeueing dead")
