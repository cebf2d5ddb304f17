"""Redis ACL users per service kind (vmsched_services.tools.security.redis_acl) on a private Redis.

Every service kind runs in this process under its own Redis user, on the shared RabbitMQ and
PostgreSQL, and does its whole job (state, scheduling, a balancing migration, HA checks, the unit
catalogues, host and cluster removal) without one refusal in the server's ACL LOG; then each thing a
role must not do is refused, by the role's own user (the `probing` fixture clears the ACL LOG of
those refusals after each such test, so they are not taken for a service's).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, NoPermissionError, RedisClusterException, ResponseError

from tests.factories import host_report, vm_report, vm_spec
from tests.integration.conftest import services
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterReport, DecisionStatus, MigrationDecision, UnitListing, UnitQuery
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.settings import Settings
from vmsched.store import ClusterLock, DecisionStore, Keys, PendingStore, StateCache
from vmsched.store.catalogues import UnitCatalogues
from vmsched.store.generations import GenerationMarkers
from vmsched.store.group_reads import GroupReads
from vmsched.store.redis import connect as connect_redis
from vmsched_services.tools.procs import delete_broker_objects
from vmsched_services.tools.security.redis_acl import REDIS_ROLES, aclfile, apply, users
from vmsched_services.tools.security.roles import ADMIN, ENGINE, SERVICE_ROLES, user_name
from vmsched_services.tools.servers.redis import PrivateRedis, PrivateRedisCluster, SentinelGroup

pytestmark = pytest.mark.integration

T = TypeVar("T")

#: vm_evenly_distributed: HighVmCount 10, MigrationThreshold 5: a host with 12 VMs beside empty ones is relieved.
POLICY = "vm_evenly_distributed"
OPS = ("ops", "ops-password")
PASSWORDS = {role: f"pw-{role}-{uuid.uuid4().hex[:8]}" for role in REDIS_ROLES}


def no_retry_client(port: int, username: str | None = None, password: str | None = None) -> aioredis.Redis:
    """A client that takes a refused sign-in as final (the default one tries again for seconds)."""
    return aioredis.Redis(port=port, username=username, password=password, retry=Retry(NoBackoff(), 0))


@dataclass(frozen=True)
class AclRedis:
    server: PrivateRedis
    settings: Settings

    def url(self, role: str) -> str:
        return f"redis://{user_name(role)}:{PASSWORDS[role]}@127.0.0.1:{self.server.port}/0"

    def as_role(self, role: str) -> aioredis.Redis:
        return no_retry_client(self.server.port, user_name(role), PASSWORDS[role])

    def ops(self) -> aioredis.Redis:
        return no_retry_client(self.server.port, *OPS)

    def role_settings(self, role: str) -> Settings:
        return self.settings.model_copy(update={"redis_url": self.url(role)})


@contextlib.asynccontextmanager
async def connected(client: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
async def acl_redis(
    settings: Settings, database: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[AclRedis]:
    """A private Redis whose only users are an operator's, and the roles' as redis_acl.apply makes
    them (the default user off); the settings of this module's services, on it."""
    await migrate(database)
    server = PrivateRedis(tmp_path_factory.mktemp("redis-acl"))
    await server.start()
    async with connected(server.client()) as default:
        await default.execute_command("ACL", "SETUSER", OPS[0], "on", f">{OPS[1]}", "~*", "&*", "+@all")  # type: ignore[no-untyped-call]
        # One made before, by mistake: apply takes it away.
        await default.execute_command("ACL", "SETUSER", user_name(ENGINE), "on", ">engine", "~*", "+@all")  # type: ignore[no-untyped-call]
        await apply(default, users(PASSWORDS, settings.redis_prefix), disable_default=True)
    cfg = settings.model_copy(
        update={
            "postgres_url": database,
            "amqp_prefix": f"{settings.amqp_prefix}acl.",
            "balance_interval_s": 0.5,
            "ha_interval_s": 0.5,
            "lease_ttl_s": 1.5,
            "migration_cooldown_s": 60.0,
            "resync_repeat_s": 0.5,
        }
    )
    try:
        yield AclRedis(server, cfg)
    finally:
        await server.kill()
        await delete_broker_objects(cfg)


@pytest.fixture(scope="module")
async def stack(acl_redis: AclRedis) -> AsyncIterator[Settings]:
    """Every service kind in this process, each on its own Redis user."""
    async with contextlib.AsyncExitStack() as running:
        for role in SERVICE_ROLES:  # the state tracker first: it declares the state queue
            await running.enter_async_context(services(acl_redis.role_settings(role), role))
        yield acl_redis.settings


async def eventually(probe: Callable[[], Awaitable[T]], what: str, timeout: float = 20.0) -> T:
    for _ in range(int(timeout / 0.1)):
        got = await probe()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout:g} s")


async def _absent(client: aioredis.Redis, key: str) -> bool:
    return not await client.exists(key)


async def refusals(acl: AclRedis) -> list[dict[str, Any]]:
    """What the ACL LOG holds: every command, key or password refused."""
    async with connected(acl.ops()) as ops:
        entries: list[dict[str, Any]] = await ops.acl_log()
    return entries


@pytest.fixture
async def probing(acl_redis: AclRedis) -> AsyncIterator[AclRedis]:
    """For a test whose refusals are on purpose: the ACL LOG is cleared of them afterwards."""
    yield acl_redis
    async with connected(acl_redis.ops()) as ops:
        await ops.acl_log_reset()


async def test_every_service_does_its_job_under_its_own_user(
    stack: Settings, acl_redis: AclRedis, client: SchedulerClient, unique: str
) -> None:
    cluster = f"acl-{unique}"
    keys = Keys.from_settings(stack)
    pool = await connect_pg(stack.postgres_url)
    try:
        await PolicyRepository(pool).set_cluster_policy(cluster, POLICY, ha_reservation=True)
    finally:
        await pool.close()
    await client.policy_changed(cluster_id=cluster)
    migrations: asyncio.Queue[MigrationDecision] = asyncio.Queue()
    await client.bus.subscribe([c.migration_key(cluster)], [MigrationDecision], migrations.put)

    await client.report_cluster(ClusterReport(cluster_id=cluster))
    for h in ("a", "b", "c"):
        await client.report_host(host_report(cluster, h, cpu_cores=32, physical_mem_mb=262144, mem_free_mb=200000))
    for i in range(12):
        await client.report_vm(vm_report(cluster, f"a-vm{i}", "a", mem_mb=1024, vcpus=1, cpu_usage_pct=10.0 + i))
    # An HA VM no other host has the memory for: a fails the HA check (busy, so never the one moved).
    big = vm_report(cluster, "ha-vm", "a", mem_mb=250_000, vcpus=1, mem_usage_pct=100.0, cpu_usage_pct=90.0, ha=True)
    await client.report_vm(big)
    await client.wait_for_state(cluster, hosts=3)

    placed = [await client.schedule(cluster, vm_spec(f"new{i}", mem_mb=1024, vcpus=1)) for i in range(3)]
    assert [d.status for d in placed] == [DecisionStatus.PLACED] * 3, placed

    # The balancer relieves a (through the selector); the HA monitor's turn remembers a as failing.
    migration = await asyncio.wait_for(migrations.get(), 20)
    assert migration.source_host == "a"
    assert (await client.ha_check(cluster)).failing_hosts == ["a"]
    async with connected(acl_redis.ops()) as ops:
        assert await eventually(lambda: ops.get(keys.ha_state(cluster)), "an HA monitor turn") == b'["a"]'

    # Every service kind announced its units; policy-admin reads them all.
    listing = await client.bus.call(c.RPC_UNITS_LIST, UnitQuery(), UnitListing)
    assert {"filter-worker", "weigher", "balancer", "selector"} <= set(listing.running)

    # The reads of callers without Redis, each made by a service under its own user: the state
    # tracker's (clusters, decisions) and the selector's what-if.
    recent_over_bus = await client.recent_decisions(cluster)
    assert {d.request_id for d in placed} <= {d.request_id for d in recent_over_bus.decisions}
    assert await client.decision(cluster, placed[0].request_id) == placed[0]
    assert cluster in {s.cluster_id for s in (await client.clusters()).clusters}
    assert (await client.what_if(cluster, vm_spec("maybe", mem_mb=1024, vcpus=1))).hosts

    await client.remove_hosts(cluster, ["c"])
    await client.wait_for_state(cluster, hosts=2)

    # The operator's direct reads (`vmsched decisions`, `explain`, `clusters list`) as the admin user.
    admin = acl_redis.role_settings(ADMIN)
    async with connected(aioredis.Redis.from_url(admin.redis_url)) as r:
        recent = await DecisionStore(r, admin).recent(cluster)
        assert {d.request_id for d in placed} <= {d.request_id for d in recent}
        assert await DecisionStore(r, admin).get(cluster, placed[0].request_id) == placed[0]
        assert cluster in await StateCache(r, admin).clusters()

        await client.remove_cluster(cluster)

        async def gone() -> bool:
            return cluster not in await StateCache(r, admin).clusters()

        await eventually(gone, "the cluster removed")
    async with connected(acl_redis.ops()) as ops:
        # The tracker's last step of a removal: the cluster's HA status goes (after its pending records).
        await eventually(lambda: _absent(ops, keys.ha_state(cluster)), "the cluster's HA status removed")

    depth = await client.bus.queue_depths([c.DEAD_LETTER_QUEUE])
    assert depth[c.DEAD_LETTER_QUEUE] == 0
    assert await refusals(acl_redis) == []


async def test_the_store_paths_the_scenario_may_not_reach(acl_redis: AclRedis, unique: str) -> None:
    """Recovery's marker install (selector), decision republish claims, and the tracker's gauges."""
    cluster = f"paths-{unique}"
    selector = acl_redis.role_settings("selector")
    async with connected(aioredis.Redis.from_url(selector.redis_url)) as r:
        markers = GenerationMarkers(r, selector)
        assert await markers.install(cluster, 1, resync=False) == 1
        assert (await markers.read(cluster)).generation == 1
        lock = ClusterLock(r, selector)
        async with lock.hold(cluster) as lease:
            assert await lock.current_token(cluster) == lease.token
            assert await PendingStore(r, selector).record(cluster, [], lease.token) >= 0
        decisions = DecisionStore(r, selector)
        assert await decisions.claim_republish(cluster, [uuid.uuid4()], 1.0) == [False]
        assert await decisions.mark_published_many(cluster, [uuid.uuid4()]) == [False]
        await decisions.release_claim(cluster, uuid.uuid4())
    tracker = acl_redis.role_settings("state-tracker")
    async with connected(aioredis.Redis.from_url(tracker.redis_url)) as r:
        assert await PendingStore(r, tracker).counts([cluster]) == {cluster: 0}
        assert await PendingStore(r, tracker).forget(cluster) == 0
        assert await GenerationMarkers(r, tracker).complete(cluster, 1, 0, 0) == -1
    assert await refusals(acl_redis) == []


# ---------------------------------------------------------------- refusals
async def refused(call: Awaitable[object]) -> str:
    with pytest.raises(NoPermissionError) as caught:
        await call
    return str(caught.value)


async def test_a_filter_worker_can_neither_take_the_lock_nor_write_pending(probing: AclRedis, unique: str) -> None:
    cfg = probing.settings
    async with connected(probing.as_role("filter-worker")) as r:
        await refused(ClusterLock(r, cfg).acquire(f"c-{unique}", timeout_s=0.1))
        await refused(r.hset(Keys.from_settings(cfg).pending(f"c-{unique}"), "vm", "{}"))


async def test_the_weigher_cannot_write_state(probing: AclRedis, unique: str) -> None:
    k = Keys.from_settings(probing.settings)
    async with connected(probing.as_role("weigher")) as r:
        await refused(r.set(k.state_version(f"c-{unique}"), 1))
        await refused(r.hset(k.state_hosts(f"c-{unique}"), "h", "{}"))
        # Nor through a script: EVALSHA may name the key, but the script's own commands are checked.
        sha = await r.script_load("return redis.call('SET', KEYS[1], 1)")
        with pytest.raises(ResponseError, match="can't access at least one of the keys"):
            await r.evalsha(sha, 1, k.state_version(f"c-{unique}"))


async def test_no_user_may_run_administrative_commands(probing: AclRedis) -> None:
    for role in REDIS_ROLES:
        async with connected(probing.as_role(role)) as r:
            await refused(r.flushall())
            await refused(r.flushdb())
            await refused(r.config_set("maxmemory", "1"))
            await refused(r.keys("*"))
            await refused(r.acl_setuser(user_name(role), commands=["+@all"]))
            await refused(r.script_flush())
            await refused(r.info("clients"))


async def test_no_user_reads_another_prefixs_keys(probing: AclRedis) -> None:
    other = Keys(f"{probing.settings.redis_prefix}-other")
    for role in REDIS_ROLES:
        async with connected(probing.as_role(role)) as r:
            await refused(r.get(other.state_version("c1")))
            await refused(r.smembers(other.clusters()))


async def test_the_default_user_is_off_and_the_engine_has_no_user(probing: AclRedis) -> None:
    async with connected(no_retry_client(probing.server.port)) as default:
        with pytest.raises(AuthenticationError):
            await default.ping()
    async with connected(no_retry_client(probing.server.port, user_name(ENGINE), "engine")) as engine:
        with pytest.raises(AuthenticationError):
            await engine.ping()
    async with connected(probing.ops()) as ops:
        names = {u.decode() if isinstance(u, bytes) else u for u in await ops.acl_users()}
    assert names == {"default", OPS[0], *(user_name(r) for r in REDIS_ROLES)}


async def test_applying_again_takes_away_what_was_dropped(probing: AclRedis) -> None:
    prefix = probing.settings.redis_prefix
    wider = [replace(u, rules=(*u.rules, "+flushall")) if u.role == "weigher" else u for u in users(PASSWORDS, prefix)]
    async with connected(probing.ops()) as ops:
        await apply(ops, wider)
        assert "+flushall" in await commands_of(ops, user_name("weigher"))
        await apply(ops, users(PASSWORDS, prefix))
        assert "+flushall" not in await commands_of(ops, user_name("weigher"))


async def commands_of(ops: aioredis.Redis, user: str) -> list[str]:
    found = await ops.acl_getuser(user)
    assert found is not None
    return cast(list[str], found["commands"])


class AclFileRedis(PrivateRedis):
    def __init__(self, directory: Path, acl: Path) -> None:
        super().__init__(directory)
        self.acl = acl

    def command(self) -> list[str]:
        return [*super().command(), "--aclfile", str(self.acl)]


async def test_a_server_started_from_the_aclfile_has_the_same_users(probing: AclRedis, tmp_path: Path) -> None:
    acl = tmp_path / "users.acl"
    acl.write_text(aclfile(users(PASSWORDS, probing.settings.redis_prefix)))
    assert "pw-" not in acl.read_text()  # no password in clear
    server = AclFileRedis(tmp_path / "redis", acl)
    await server.start()
    try:
        async with connected(no_retry_client(server.port)) as default:
            with pytest.raises(AuthenticationError):
                await default.ping()
        async with connected(no_retry_client(server.port, user_name("weigher"), PASSWORDS["weigher"])) as r:
            assert await r.ping()
            await refused(r.set(Keys.from_settings(probing.settings).state_version("c1"), 1))
    finally:
        await server.kill()


async def test_a_wrong_password_is_refused(probing: AclRedis) -> None:
    async with connected(no_retry_client(probing.server.port, user_name("selector"), "wrong")) as r:
        with pytest.raises(AuthenticationError):
            await r.ping()


async def test_on_redis_cluster_the_users_need_the_cluster_commands(
    settings: Settings, tmp_path: Path, unique: str
) -> None:
    """apply reaches every node; a selector and a weigher then do their part through the cluster
    client only with `cluster=True` (CLUSTER SLOTS, COMMAND)."""
    async with PrivateRedisCluster(tmp_path) as nodes:
        cfg = settings.model_copy(update=nodes.settings_update())
        admin = RedisCluster.from_url(nodes.url)
        try:
            await apply(admin, users(PASSWORDS, cfg.redis_prefix))
        finally:
            await admin.aclose()
        for node in nodes.nodes:  # every node has the users
            async with connected(no_retry_client(node.port, user_name("weigher"), PASSWORDS["weigher"])) as r:
                assert await r.ping()

        def as_role(role: str) -> Settings:
            return cfg.model_copy(update={"redis_url": f"redis://{user_name(role)}:{PASSWORDS[role]}@{nodes.url[8:]}"})

        async with connected(connect_redis(as_role("selector"))) as r:
            # CLUSTER SLOTS refused; redis-py says so as "Cluster mode is not enabled on this node".
            with pytest.raises(RedisClusterException):
                await r.ping()

        admin = RedisCluster.from_url(nodes.url)
        try:
            await apply(admin, users(PASSWORDS, cfg.redis_prefix, cluster=True))
        finally:
            await admin.aclose()
        cluster = f"rc-{unique}"
        selector = as_role("selector")
        async with connected(connect_redis(selector)) as r:
            assert await GenerationMarkers(r, selector).install(cluster, 1, resync=False) == 1
            async with ClusterLock(r, selector).hold(cluster) as lease:
                assert await PendingStore(r, selector).record(cluster, [], lease.token) >= 0
            # The reads that go as one pipeline on one server go side by side here (redis-py sends
            # no script in a cluster pipeline).
            decisions = DecisionStore(r, selector)
            reads = GroupReads(r, PendingStore(r, selector), decisions, StateCache(r, selector))
            assert (await reads.read(cluster, [uuid.uuid4()])).records == [None]
            other = f"{cluster}-b"
            asks = {cluster: [uuid.uuid4()], other: [uuid.uuid4(), uuid.uuid4()]}
            assert await decisions.records_by_cluster(asks) == {cluster: [None], other: [None, None]}
            await UnitCatalogues(r, selector).announce("selector", "i1", {"u": "builtin"})
        weigher = as_role("weigher")
        async with connected(connect_redis(weigher)) as r:
            await UnitCatalogues(r, weigher).announce("weigher", "i1", {"u": "builtin"})
            with pytest.raises(NoPermissionError):
                await r.set(Keys.from_settings(weigher).state_version(cluster), 1)


async def test_behind_sentinels_the_users_are_applied_on_every_server(
    settings: Settings, tmp_path: Path, unique: str
) -> None:
    """ACLs are not replicated: applied on the primary and the replica (either may be the master),
    a selector reaches the master through the sentinels with no command beyond its own."""
    async with SentinelGroup(tmp_path) as group:
        for server in (group.primary, group.replica):
            async with connected(server.client()) as default:
                await apply(default, users(PASSWORDS, settings.redis_prefix))
        cfg = settings.model_copy(
            update={
                **group.settings_update(),
                "redis_url": f"redis://{user_name('selector')}:{PASSWORDS['selector']}@/0",
            }
        )
        cluster = f"sentinel-{unique}"
        async with connected(connect_redis(cfg)) as r:
            assert await GenerationMarkers(r, cfg).install(cluster, 1, resync=False) == 1
            async with ClusterLock(r, cfg).hold(cluster) as lease:
                assert await PendingStore(r, cfg).record(cluster, [], lease.token) >= 0
        async with connected(no_retry_client(group.replica.port, user_name("selector"), PASSWORDS["selector"])) as r:
            assert await r.ping()
