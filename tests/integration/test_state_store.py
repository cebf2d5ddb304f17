"""Cluster state in a real Redis: the writer's derivations and versions, restarts, and the
workers' cache catching up incrementally (or in full when it must)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from functools import partial
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from tests.factories import first_generation, host_report, vm_report
from vmsched.contracts import (
    ClusterReport,
    FilterRequest,
    HostState,
    UnitCall,
    VmReport,
    VmSpec,
    VmStatus,
    WeighRequest,
)
from vmsched.errors import StaleState, UnknownCluster
from vmsched.runtime import Runtime
from vmsched.scheduling.hosts import BOOLEAN_COLUMNS, NUMERIC_COLUMNS, OBJECT_COLUMNS, HostTable
from vmsched.settings import Settings
from vmsched.store import Keys, StateCache, StateWriter
from vmsched_services.filter_worker.service import FilterWorker
from vmsched_services.weigher.service import Weigher

pytestmark = pytest.mark.integration


#: Roomy 16-core hosts with the model's reserved memory, and 1000 MB (+24 MB) 2-vCPU VMs.
host = partial(host_report, cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000)
vm = partial(vm_report, mem_mb=1000, overhead_mb=24, vcpus=2)


@pytest.fixture
def writer(redis_client: aioredis.Redis, settings: Settings) -> StateWriter:
    return StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))


@pytest.fixture
def cache(redis_client: aioredis.Redis, settings: Settings) -> StateCache:
    return StateCache(redis_client, settings, stale_wait_s=0.2)


@pytest.fixture
def run_keys(settings: Settings) -> Keys:
    """The keys under the run's own prefix: those the writer and cache above (and the services) use."""
    return Keys(settings.redis_prefix)


async def changes(
    client: aioredis.Redis, key: str, start: str = "-", end: str = "+"
) -> list[tuple[bytes, dict[bytes, bytes]]]:
    return cast(list[tuple[bytes, dict[bytes, bytes]]], await client.xrange(key, start, end))


def column(table: HostTable, name: str, host_id: str) -> float:
    pos = table.position(host_id)
    assert pos is not None
    return float(getattr(table, name)[pos])


# ---------------------------------------------------------------------- writer


async def test_versions_increase_by_one_per_apply(
    writer: StateWriter, redis_client: aioredis.Redis, run_keys: Keys, unique: str
) -> None:
    c = f"c-{unique}"
    versions = [
        await writer.apply_cluster(ClusterReport(cluster_id=c)),
        await writer.apply_host(host(c, "h1")),
        await writer.apply_vm(vm(c, "vm-1", "h1")),
        await writer.apply_vm(vm(c, "vm-unknown", None, VmStatus.DOWN)),  # changes nothing, still a version
        await writer.apply_host(host(c, "h1", mem_free_mb=1)),
    ]
    assert versions == [1, 2, 3, 4, 5]
    assert await redis_client.get(run_keys.state_version(c)) == b"5"
    stream = await changes(redis_client, run_keys.state_changes(c))
    assert [entry_id for entry_id, _ in stream] == [f"{v}-0".encode() for v in versions]
    changed = [json.loads(fields[b"hosts"]) for _, fields in stream]
    assert changed == [[], ["h1"], ["h1"], [], ["h1"]]
    assert [fields[b"cluster"] for _, fields in stream] == [b"1", b"0", b"0", b"0", b"0"]
    assert c.encode() in await redis_client.smembers(run_keys.clusters())


async def test_aggregates_follow_vms_between_hosts(
    writer: StateWriter, redis_client: aioredis.Redis, run_keys: Keys, unique: str
) -> None:
    c = f"c-{unique}"
    for h in ("h1", "h2"):
        await writer.apply_host(host(c, h))
    await writer.apply_vm(vm(c, "vm-1", "h1", VmStatus.STARTING, vcpus=4, exclusive_cpus=True, ha=True))
    await writer.apply_vm(vm(c, "vm-2", "h1", mem_mb=2000, overhead_mb=0))

    async def stored(h: str) -> HostState:
        raw = await redis_client.hget(run_keys.state_hosts(c), h)
        assert raw is not None
        return HostState.model_validate_json(raw)

    h1 = await stored("h1")
    assert (h1.vm_count, h1.mem_committed_mb, h1.vcpus_committed, h1.cpus_pinned, h1.ha_vm_count) == (
        2,
        1024 + 2000,
        6,
        4,
        1,
    )

    # vm-1 migrates to h2: both hosts change in one version.
    version = await writer.apply_vm(vm(c, "vm-1", "h2", VmStatus.MIGRATING, vcpus=4, exclusive_cpus=True, ha=True))
    [(_, fields)] = await changes(redis_client, run_keys.state_changes(c), f"{version}-0", f"{version}-0")
    assert json.loads(fields[b"hosts"]) == ["h1", "h2"]
    h1, h2 = await stored("h1"), await stored("h2")
    assert (h1.vm_count, h1.mem_committed_mb, h1.cpus_pinned, h1.ha_vm_count) == (1, 2000, 0, 0)
    assert (h2.vm_count, h2.mem_committed_mb, h2.cpus_pinned, h2.ha_vm_count) == (1, 1024, 4, 1)

    # vm-2 goes down: removed from the VM hash, no longer counted.
    await writer.apply_vm(vm(c, "vm-2", "h1", VmStatus.DOWN, mem_mb=2000, overhead_mb=0))
    assert not await redis_client.hexists(run_keys.state_vms(c), "vm-2")
    assert await redis_client.hexists(run_keys.state_vms(c), "vm-1")
    h1 = await stored("h1")
    assert (h1.vm_count, h1.mem_committed_mb, h1.vcpus_committed) == (0, 0, 0)

    # A failed start removes it just the same.
    await writer.apply_vm(vm(c, "vm-1", "h2", VmStatus.FAILED))
    assert (await stored("h2")).vm_count == 0
    assert await redis_client.hlen(run_keys.state_vms(c)) == 0


async def test_host_report_keeps_vm_aggregates(writer: StateWriter, unique: str) -> None:
    c = f"c-{unique}"
    # A VM reported before its host: counted as soon as the host reports.
    await writer.apply_vm(vm(c, "vm-1", "h1"))
    assert writer.host_state(c, "h1") is None
    await writer.apply_host(host(c, "h1"))
    state = writer.host_state(c, "h1")
    assert state is not None
    assert state.vm_count == 1
    await writer.apply_host(host(c, "h1", mem_free_mb=5))
    state = writer.host_state(c, "h1")
    assert state is not None
    assert (state.vm_count, state.report.mem_free_mb) == (1, 5)


async def test_restart_keeps_state(
    writer: StateWriter, redis_client: aioredis.Redis, settings: Settings, cache: StateCache, unique: str
) -> None:
    c = f"c-{unique}"
    await writer.apply_cluster(ClusterReport(cluster_id=c, memory_overcommit_pct=150))
    for h in ("h1", "h2"):
        await writer.apply_host(host(c, h))
    await writer.apply_vm(vm(c, "vm-1", "h1"))
    await writer.apply_vm(vm(c, "vm-2", "h1"))
    before = writer.snapshot(c)
    assert before is not None

    restarted = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    assert c in await restarted.load()
    assert restarted.snapshot(c) == before
    assert await cache.snapshot(c) == before

    # The restarted writer continues from the stored VMs and version.
    version = await restarted.apply_vm(vm(c, "vm-1", "h2"))
    assert version == before.version + 1
    h1, h2 = restarted.host_state(c, "h1"), restarted.host_state(c, "h2")
    assert h1 is not None
    assert h2 is not None
    assert (h1.vm_count, h2.vm_count) == (1, 1)


async def test_writer_reloads_when_redis_moved_on(
    writer: StateWriter, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    c = f"c-{unique}"
    await writer.apply_host(host(c, "h1"))
    # Someone else writes the cluster (not how it should run, but the guard must hold).
    other = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    await other.apply_vm(vm(c, "vm-1", "h1"))
    version = await writer.apply_vm(vm(c, "vm-2", "h1"))
    assert version == 3
    state = writer.host_state(c, "h1")
    assert state is not None
    assert state.vm_count == 2


# ---------------------------------------------------------------------- cache


async def test_state_stored_by_an_older_version_still_loads(
    writer: StateWriter, redis_client: aioredis.Redis, settings: Settings, run_keys: Keys, unique: str
) -> None:
    """An upgrade removed a field: records stored before it still load (the field is dropped)."""
    cluster = f"old-{unique}"
    await writer.apply_cluster(ClusterReport(cluster_id=cluster))
    await writer.apply_host(host(cluster, "h1"))
    # what an older version wrote: fields this version no longer has, top-level and nested
    raw_settings = await redis_client.get(run_keys.state_cluster(cluster))
    assert raw_settings is not None
    settings_blob = json.loads(raw_settings)
    await redis_client.set(run_keys.state_cluster(cluster), json.dumps({**settings_blob, "ha_reservation": False}))
    raw_host = await redis_client.hget(run_keys.state_hosts(cluster), "h1")
    assert raw_host is not None
    host_blob = json.loads(raw_host)
    host_blob["report"]["retired_field"] = 1
    await redis_client.hset(run_keys.state_hosts(cluster), "h1", json.dumps(host_blob))

    restarted = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    await restarted.load([cluster])
    assert restarted.host_state(cluster, "h1") is not None
    _, table = await StateCache(redis_client, settings).table(cluster)
    assert table.ids == ("h1",)
    snapshot = await StateCache(redis_client, settings).snapshot(cluster)
    assert snapshot.settings.cluster_id == cluster

    # a record that is wrong, not merely old, is still refused
    await redis_client.set(run_keys.state_cluster(cluster), json.dumps({**settings_blob, "memory_overcommit_pct": "x"}))
    with pytest.raises(ValueError, match="memory_overcommit_pct"):
        await StateCache(redis_client, settings).snapshot(cluster)
    # ... but it does not keep a restarting state tracker from loading the other clusters.
    other = f"{cluster}-other"
    await restarted.apply_cluster(ClusterReport(cluster_id=other))
    again = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    assert await again.load([cluster, other]) == [other]


async def test_unknown_cluster(cache: StateCache, unique: str) -> None:
    with pytest.raises(UnknownCluster):
        await cache.table(f"nope-{unique}")
    with pytest.raises(UnknownCluster):
        await cache.table(f"nope-{unique}", min_version=1)
    with pytest.raises(UnknownCluster):
        await cache.snapshot(f"nope-{unique}")


async def test_cache_catches_up_reading_only_changed_hosts(
    writer: StateWriter, cache: StateCache, redis_client: aioredis.Redis, run_keys: Keys, unique: str
) -> None:
    c = f"c-{unique}"
    for h in ("h3", "h1", "h2"):
        await writer.apply_host(host(c, h, mem_free_mb=1000))
    version, table = await cache.table(c)
    assert version == 3
    assert table.ids == ("h1", "h2", "h3")  # ordered by id, whatever the report order
    assert cache.stats.full_loads == 1

    # Behind the writer's back (no change entry): h1's stored record changes. A full load would
    # see it, an incremental catch-up must not read h1 at all.
    sneaky = HostState(report=host(c, "h1", mem_free_mb=4242))
    await redis_client.hset(run_keys.state_hosts(c), "h1", sneaky.model_dump_json())

    await writer.apply_host(host(c, "h2", mem_free_mb=2000))
    await writer.apply_vm(vm(c, "vm-1", "h3"))
    version, table = await cache.table(c)
    assert version == 5
    assert cache.stats.full_loads == 1
    assert cache.stats.incremental_loads == 1
    assert cache.stats.hosts_fetched == 2
    assert column(table, "mem_free_mb", "h1") == 1000  # not re-read
    assert column(table, "mem_free_mb", "h2") == 2000
    assert column(table, "vm_count", "h3") == 1
    assert column(table, "mem_committed_mb", "h3") == 1024

    # Up to date: the same table, nothing read but the version.
    again_version, again = await cache.table(c)
    assert (again_version, again) == (version, table)
    assert cache.stats.incremental_loads == 1

    # Cluster settings changes reach the table too.
    await writer.apply_cluster(ClusterReport(cluster_id=c, count_threads_as_cores=True))
    _, table = await cache.table(c)
    assert table.settings.count_threads_as_cores is True
    assert table.ids == ("h1", "h2", "h3")

    # A trimmed stream no longer holds the cache's next version: full load (which sees h1 now).
    await writer.apply_host(host(c, "h2", mem_free_mb=3000))
    await writer.apply_host(host(c, "h2", mem_free_mb=3500))
    await redis_client.xtrim(run_keys.state_changes(c), maxlen=1, approximate=False)
    version, table = await cache.table(c)
    assert version == 8
    assert cache.stats.full_loads == 2
    assert column(table, "mem_free_mb", "h1") == 4242
    assert column(table, "mem_free_mb", "h2") == 3500


async def test_cache_catches_up_through_new_and_unreadable_hosts_without_a_full_load(
    writer: StateWriter,
    cache: StateCache,
    redis_client: aioredis.Redis,
    settings: Settings,
    run_keys: Keys,
    unique: str,
) -> None:
    """The cache keeps no host models, only its table: hosts that appear are inserted in id order
    and a changed record that cannot be read drops its row, all incrementally, and the table
    equals what a fresh full load builds."""
    c = f"c-{unique}"
    for h in ("h2", "h4"):
        await writer.apply_host(host(c, h, mem_free_mb=1000))
    _, first = await cache.table(c)
    assert first.ids == ("h2", "h4")

    await writer.apply_host(host(c, "h3", mem_free_mb=3000))
    await writer.apply_host(host(c, "h1", mem_free_mb=1500))
    await writer.apply_vm(vm(c, "vm-1", "h4"))
    version, table = await cache.table(c)
    assert (version, table.ids) == (5, ("h1", "h2", "h3", "h4"))
    assert (cache.stats.full_loads, cache.stats.incremental_loads) == (1, 1)
    assert column(table, "mem_free_mb", "h3") == 3000
    assert column(table, "vm_count", "h4") == 1
    assert first.ids == ("h2", "h4")  # the table handed out before is untouched

    # h2 changes, then its stored record is broken before the cache reads it: the row goes.
    await writer.apply_host(host(c, "h2", mem_free_mb=2000))
    await redis_client.hset(run_keys.state_hosts(c), "h2", b"{not json")
    version, table = await cache.table(c)
    assert (version, table.ids) == (6, ("h1", "h3", "h4"))
    assert cache.stats.full_loads == 1

    _, full = await StateCache(redis_client, settings).table(c)
    assert full.ids == table.ids
    for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS):
        np.testing.assert_array_equal(getattr(table, name), getattr(full, name), err_msg=name)
    for name in OBJECT_COLUMNS:
        assert tuple(getattr(table, name)) == tuple(getattr(full, name)), name


async def test_min_version(writer: StateWriter, cache: StateCache, unique: str) -> None:
    c = f"c-{unique}"
    await writer.apply_host(host(c, "h1"))
    version, _ = await cache.table(c, min_version=1)
    assert version == 1

    with pytest.raises(StaleState, match="has not reached 5"):
        await cache.table(c, min_version=5)

    async def report_later() -> None:
        await asyncio.sleep(0.05)
        await writer.apply_host(host(c, "h1", mem_free_mb=7))

    task = asyncio.create_task(report_later())
    version, table = await cache.table(c, min_version=2)
    await task
    assert version == 2
    assert column(table, "mem_free_mb", "h1") == 7


async def test_a_cache_behind_the_version_asked_catches_up_in_one_round_trip(
    writer: StateWriter, counted: tuple[aioredis.Redis, list[str]], settings: Settings, unique: str
) -> None:
    """A worker's request names the state version it was made at; a cache behind it catches up with
    the catch-up script alone (it reads the current version itself), not a version read first."""
    redis, commands = counted
    c = f"c-{unique}"
    await writer.apply_host(host(c, "h1"))
    cache = StateCache(redis, settings, stale_wait_s=0.2)
    await cache.table(c, min_version=1)
    await cache.table(c)  # the catch-up script is loaded on this client
    await writer.apply_host(host(c, "h1", mem_free_mb=7))
    commands.clear()
    version, table = await cache.table(c, min_version=2)
    assert version == 2
    assert column(table, "mem_free_mb", "h1") == 7
    assert len(commands) == 1, commands
    assert cache.stats.incremental_loads >= 1


async def test_concurrent_callers_load_once(
    writer: StateWriter, redis_client: aioredis.Redis, settings: Settings, unique: str
) -> None:
    c = f"c-{unique}"
    for i in range(20):
        await writer.apply_host(host(c, f"h{i:02d}"))
    cache = StateCache(redis_client, settings)
    results = await asyncio.gather(*(cache.table(c) for _ in range(30)))
    assert {v for v, _ in results} == {20}
    assert cache.stats.full_loads == 1
    assert len({id(t) for _, t in results}) == 1


async def test_snapshot_and_clusters(writer: StateWriter, cache: StateCache, unique: str) -> None:
    c = f"c-{unique}"
    await writer.apply_host(host(c, "h2"))
    await writer.apply_host(host(c, "h1"))
    await writer.apply_vm(vm(c, "vm-b", "h1"))
    await writer.apply_vm(vm(c, "vm-a", "h2"))
    snap = await cache.snapshot(c)
    assert snap.version == 4
    assert [h.report.host_id for h in snap.hosts] == ["h1", "h2"]
    assert [v.vm_id for v in snap.vms] == ["vm-a", "vm-b"]
    assert snap.settings == ClusterReport(cluster_id=c)  # never reported: the defaults
    assert c in await cache.clusters()


# ---------------------------------------------------------------------- property

HOSTS = ["h1", "h2", "h3"]
#: Stated here, not imported: the test must not share the implementation's definition.
COUNTED = {VmStatus.STARTING, VmStatus.RUNNING, VmStatus.MIGRATING}
vm_reports = st.lists(
    st.tuples(
        st.sampled_from(["vm-1", "vm-2", "vm-3", "vm-4"]),
        st.sampled_from([*HOSTS, None]),
        st.sampled_from(list(VmStatus)),
        st.integers(min_value=1, max_value=4096),
        st.integers(min_value=1, max_value=8),
        st.booleans(),
        st.booleans(),
    ),
    max_size=25,
)


@hyp_settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reports=vm_reports)
def test_aggregates_equal_a_recomputation(settings: Settings, reports: list[tuple[Any, ...]]) -> None:
    """After any sequence of VM reports, every host's aggregates equal a recomputation from the
    last report of each VM, in memory, in Redis, and in a cache that caught up step by step."""

    async def scenario() -> None:
        client = aioredis.Redis.from_url(settings.redis_url, decode_responses=False)
        try:
            c = f"p-{uuid.uuid4().hex[:8]}"
            writer = StateWriter(client, settings, recover=first_generation(client, settings))
            cache = StateCache(client, settings)
            for h in HOSTS:
                await writer.apply_host(host(c, h))
            last: dict[str, VmReport] = {}
            for i, (vm_id, host_id, status, mem, vcpus, exclusive, ha) in enumerate(reports):
                report = vm(c, vm_id, host_id, status, mem_mb=mem, vcpus=vcpus, exclusive_cpus=exclusive, ha=ha)
                await writer.apply_vm(report)
                last[vm_id] = report
                if i % 3 == 0:
                    await cache.table(c)

            expected: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
            for r in last.values():
                if r.status in COUNTED and r.host_id is not None:
                    agg = expected[r.host_id]
                    agg[0] += 1
                    agg[1] += r.mem_mb + r.overhead_mb
                    agg[2] += r.vcpus
                    agg[3] += r.vcpus if r.exclusive_cpus else 0
                    agg[4] += 1 if r.ha else 0

            snap = await StateCache(client, settings).snapshot(c)
            assert snap.version == len(HOSTS) + len(reports)
            assert snap == writer.snapshot(c)
            for hs in snap.hosts:
                got = [hs.vm_count, hs.mem_committed_mb, hs.vcpus_committed, hs.cpus_pinned, hs.ha_vm_count]
                assert got == expected[hs.report.host_id], hs.report.host_id

            _, incremental = await cache.table(c)
            _, full = await StateCache(client, settings).table(c)
            for name in ("vm_count", "mem_committed_mb", "vcpus_committed", "cpus_pinned", "ha_vm_count"):
                assert np.array_equal(getattr(incremental, name), getattr(full, name)), name
        finally:
            await client.aclose()

    asyncio.run(scenario())


async def _lose_state(client: aioredis.Redis, run_keys: Keys, cluster: str) -> None:
    """Redis loses the cluster's state (a flush, a failover to an empty replica)."""
    await client.delete(
        run_keys.state_version(cluster),
        run_keys.state_hosts(cluster),
        run_keys.state_vms(cluster),
        run_keys.state_cluster(cluster),
        run_keys.state_changes(cluster),
    )


def _workers(cache: StateCache) -> tuple[Weigher, FilterWorker]:
    # The handlers read only the state cache of their runtime.
    rt = cast(Runtime, SimpleNamespace(state=cache))
    return Weigher(rt), FilterWorker(rt)


async def test_a_worker_whose_cached_state_predates_a_lost_state_reloads_or_raises_stale_state(
    writer: StateWriter,
    cache: StateCache,
    redis_client: aioredis.Redis,
    settings: Settings,
    run_keys: Keys,
    unique: str,
) -> None:
    """A cached table new enough by version number but lacking the request's hosts is reloaded (or
    StaleState answered), never an internal error."""
    c = f"c-{unique}"
    for h in ("h1", "h2", "h3", "h4", "h5"):
        await writer.apply_host(host(c, h))
    weigher, filter_worker = _workers(cache)
    assert (await cache.table(c))[0] == 5  # the workers' cache holds version 5: h1..h5

    # The state is lost and reported again by a new tracker: other hosts, versions from 1.
    await _lose_state(redis_client, run_keys, c)
    fresh = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    await fresh.apply_host(host(c, "n1"))
    await fresh.apply_host(host(c, "n2"))
    vm_spec = VmSpec(vm_id="vm-1", mem_mb=1024, vcpus=1)

    # A request made against the new version 2 with its hosts: the cache reloads and answers.
    reply = await weigher.handle(
        WeighRequest(
            request_id=uuid.uuid4(),
            cluster_id=c,
            state_version=2,
            vm=vm_spec,
            hosts=["n1", "n2"],
            weights=[UnitCall(unit="OptimalForEvenMemoryDistribution")],
        )
    )
    assert len(reply.scores.units[0].raw) == 2
    assert (await cache.table(c))[0] == 2

    # Lost once more: the cache holds version 2 (n1, n2), Redis version 1 (n4). A request made
    # against a version 2 with n4 and n5 cannot be answered from either: StaleState.
    await _lose_state(redis_client, run_keys, c)
    fresh = StateWriter(redis_client, settings, recover=first_generation(redis_client, settings))
    await fresh.apply_host(host(c, "n4"))
    with pytest.raises(StaleState, match=f"cluster {c}: state version 1 has not reached 2"):
        await weigher.handle(
            WeighRequest(
                request_id=uuid.uuid4(),
                cluster_id=c,
                state_version=2,
                vm=vm_spec,
                hosts=["n4", "n5"],
                weights=[UnitCall(unit="OptimalForEvenMemoryDistribution")],
            )
        )
    # A host the state has never had, at a version that exists: StaleState naming it.
    with pytest.raises(StaleState, match="hosts ghost of the request are unknown at state version 1"):
        await filter_worker.handle(
            FilterRequest(
                request_id=uuid.uuid4(),
                cluster_id=c,
                state_version=1,
                vm=vm_spec,
                candidates=["n4", "ghost"],
                filters=[UnitCall(unit="Memory")],
            )
        )
