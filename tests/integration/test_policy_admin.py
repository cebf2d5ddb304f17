"""Policy administration over the bus (the policy-admin service, PolicyClient): clone a built-in,
edit it as a document, apply it, attach it, see the next decision use it, roll it back; every
refusal names every problem with what to do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    ChangeAction,
    ClusterAttachment,
    DecisionStatus,
    FilterEntry,
    FilterPosition,
    PolicySet,
    WeightEntry,
)
from vmsched.db import migrate
from vmsched.errors import RemoteError
from vmsched.policy_cache import PolicyCache
from vmsched.policy_client import PolicyClient
from vmsched.scheduling.units import REGISTRY
from vmsched.settings import Settings
from vmsched.store.catalogues import UnitCatalogues, catalogue_hash
from vmsched.store.redis import connect
from vmsched_services.tools.policy_commands import dump_set, read_set

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database})
    async with services(cfg, "state-tracker", "filter-worker", "selector", "policy-admin", bus=buses):
        yield cfg


@pytest.fixture
async def admin(stack: Settings, buses: Buses) -> AsyncIterator[PolicyClient]:
    async with buses(stack, "admin") as bus:
        yield PolicyClient(stack, bus=bus)


@pytest.fixture
async def client(stack: Settings, buses: Buses) -> AsyncIterator[SchedulerClient]:
    async with buses.client(stack) as c:
        yield c


async def test_clone_edit_apply_attach_decide_and_roll_back(
    admin: PolicyClient, client: SchedulerClient, unique: str
) -> None:
    cluster, name = f"adm-{unique}", f"mine-{unique}"
    hosts = await factories.make_cluster(
        client, cluster, 3, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192, reserved_mem_mb=0
    )
    cloned = await admin.clone("none", name, description="my copy")
    assert (cloned.version, cloned.locked) == (1, False)

    # Edit: drop the Swap filter, run Memory first, and let a VM's preferred hosts decide.
    kept = [f for f in cloned.document.filters if f.unit not in ("Swap", "Memory")]
    doc = cloned.document.model_copy(
        update={
            "filters": [FilterEntry(unit="Memory", position=FilterPosition.FIRST), *kept],
            "weights": [WeightEntry(unit="PreferredHosts", factor=500)],
        }
    )
    attach = ClusterAttachment(cluster_id=cluster, policy=name)
    dry = await admin.apply(PolicySet(policies=[doc], clusters=[attach]), dry_run=True)
    assert dry.dry_run
    assert [(c.kind, c.action) for c in dry.changes] == [
        ("policy", ChangeAction.UPDATE),
        ("cluster", ChangeAction.ATTACH),
    ]
    assert "- filter Swap" in dry.changes[0].diff
    assert "~ weight PreferredHosts factor 99 -> 500" in dry.changes[0].diff
    assert (await admin.read([name])).policies[0].version == 1  # a dry run stores nothing

    done = await admin.apply(PolicySet(policies=[doc], clusters=[attach]))
    assert done.changes[0].version == 2
    again = await admin.apply(PolicySet(policies=[doc], clusters=[attach]))
    assert [c.action for c in again.changes] == [ChangeAction.UNCHANGED, ChangeAction.UNCHANGED]  # idempotent

    d = await client.schedule(
        cluster, factories.vm_spec(f"{unique}-a", mem_mb=512, vcpus=1, preferred_hosts=[hosts[2]])
    )
    assert d.status is DecisionStatus.PLACED
    assert d.policy == name
    assert d.explanation.filters[0] == "Memory"
    assert "Swap" not in d.explanation.filters
    assert d.host_id == hosts[2]

    rolled = await admin.rollback(name)
    assert rolled.changes[0].version == 3
    history = await admin.history(name)
    assert [v.version for v in history.versions] == [3, 2, 1]
    assert history.versions[0].document == history.versions[2].document

    d = await client.schedule(cluster, factories.vm_spec(f"{unique}-b", mem_mb=512, vcpus=1))
    assert d.policy == name
    assert "Swap" in d.explanation.filters  # the next decision runs the rolled-back version

    detached = await admin.detach(cluster)
    assert detached.changes[0].action is ChangeAction.DETACH
    await admin.delete(name)
    assert name not in {p.document.name for p in (await admin.read()).policies}


async def test_every_problem_is_refused_at_once_with_what_to_do(admin: PolicyClient, unique: str) -> None:
    name = f"bad-{unique}"
    doc = (
        (await admin.read(["none"]))
        .policies[0]
        .document.model_copy(
            update={
                "name": name,
                "filters": [FilterEntry(unit="Memroy"), FilterEntry(unit="OptimalForEvenCpuDistribution")],
                "weights": [WeightEntry(unit="PreferedHosts")],
                "properties": {"HighUtilisation": "75", "HighUtilization": "120"},
            }
        )
    )
    doc = doc.model_copy(update={"filters": [*doc.filters, FilterEntry(unit="CPUOverloaded")]})
    with pytest.raises(RemoteError) as info:
        await admin.apply(PolicySet(policies=[doc]))
    err = info.value
    assert err.remote_code == "invalid_policy"
    text = str(err)
    assert "unknown filter unit 'Memroy'; did you mean 'Memory'?" in text
    assert "OptimalForEvenCpuDistribution is not a filter unit (it is a weight" in text
    assert "unknown weight unit 'PreferedHosts'; did you mean 'PreferredHosts'?" in text
    assert "'HighUtilisation' is not read by any unit of the policy; did you mean 'HighUtilization'?" in text
    assert "HighUtilization must be a whole number from 50 to 99 (default 80), not '120'" in text
    assert name not in {p.document.name for p in (await admin.read()).policies}  # nothing stored


async def test_built_ins_stay_locked_and_attachments_need_a_known_policy(admin: PolicyClient, unique: str) -> None:
    none = (await admin.read(["none"])).policies[0]
    assert none.locked
    edited = none.document.model_copy(update={"description": "changed"})
    with pytest.raises(RemoteError, match="built in and locked; clone it") as info:
        await admin.apply(PolicySet(policies=[edited]))
    assert info.value.remote_code == "invalid_policy"
    unchanged = await admin.apply(PolicySet(policies=[none.document]))
    assert unchanged.changes[0].action is ChangeAction.UNCHANGED

    orphan = ClusterAttachment(cluster_id=f"c-{unique}", policy=f"nosuch-{unique}")
    with pytest.raises(RemoteError, match=f"no policy 'nosuch-{unique}'"):
        await admin.apply(PolicySet(clusters=[orphan]))
    with pytest.raises(RemoteError) as locked:
        await admin.delete("none")
    assert locked.value.remote_code == "policy_locked"


async def test_the_unit_catalogue_is_listed(admin: PolicyClient) -> None:
    units = {u.name: u for u in (await admin.units()).units}
    assert units["Memory"].filter
    assert not units["Memory"].weight
    assert any(p.name == "HighUtilization" for p in units["CPUOverloaded"].properties)


async def test_a_cached_policy_is_read_again_after_its_ttl_even_without_an_event(
    stack: Settings, buses: Buses, admin: PolicyClient, unique: str
) -> None:
    name, cluster = f"ttl-{unique}", f"ttl-{unique}"
    await admin.clone("none", name)
    await admin.apply(PolicySet(clusters=[ClusterAttachment(cluster_id=cluster, policy=name)]))
    rt = await buses.runtime(stack.model_copy(update={"policy_cache_ttl_s": 0.3}), f"cache-{unique}")
    try:
        cache = PolicyCache(rt)  # not subscribed: it hears no policy.changed event at all
        assert (await cache.for_cluster(cluster)).version == 1
        doc = (await admin.read([name])).policies[0].document
        await admin.apply(PolicySet(policies=[doc.model_copy(update={"description": "v2"})]))
        assert (await cache.for_cluster(cluster)).version == 1  # within the TTL: the cached copy
        await asyncio.sleep(0.35)
        assert (await cache.for_cluster(cluster)).version == 2
    finally:
        await rt.close()


async def test_a_unit_some_running_worker_lacks_is_saved_with_a_warning_naming_that_instance(
    stack: Settings, buses: Buses, admin: PolicyClient, unique: str
) -> None:
    # Another filter-worker instance runs without the Swap filter (an older build, a missing plugin);
    # this stack's own filter-worker has it, so the policy's calls go there (vmsched.lifecycle.routes).
    redis = connect(stack)
    catalogues = UnitCatalogues(redis, stack)
    older = {name: "builtin" for name in REGISTRY if name != "Swap"}
    await catalogues.announce("filter-worker", f"old-{unique}", older)
    name = f"needs-swap-{unique}"
    doc = (await admin.read(["none"])).policies[0].document.model_copy(update={"name": name})
    assert any(f.unit == "Swap" for f in doc.filters)
    try:
        listing = await admin.units()
        assert "Swap" not in listing.running["filter-worker"]
        assert "Memory" in listing.running["filter-worker"]
        old = next(i for i in listing.instances if i.instance == f"old-{unique}")
        assert (old.service, old.lacks, old.catalogue) == ("filter-worker", ["Swap"], catalogue_hash(older))
        ours = [i for i in listing.instances if i.service == "filter-worker" and i.instance != f"old-{unique}"]
        assert ours
        assert all("Swap" not in i.lacks for i in ours)
        dry = await admin.apply(PolicySet(policies=[doc]), dry_run=True)
        [warning] = dry.warnings
        assert warning.startswith(f"policy {name}: 1 of ")
        assert f"old-{unique} lacks Swap" in warning
        created = await admin.apply(PolicySet(policies=[doc]))
        assert created.changes[0].action is ChangeAction.CREATE
        assert created.warnings == dry.warnings
    finally:
        await catalogues.withdraw("filter-worker", f"old-{unique}")
        await redis.aclose()
    assert {u.origin for u in (await admin.units()).units} >= {"builtin"}


async def test_decimal_factors_round_trip_apply_read_export_apply_and_roll_back(
    admin: PolicyClient, client: SchedulerClient, unique: str, tmp_path: Path
) -> None:
    cluster, name = f"dec-{unique}", f"decimal-{unique}"
    await factories.make_cluster(client, cluster, 2, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)
    base = (await admin.read(["none"])).policies[0].document
    doc = base.model_copy(
        update={
            "name": name,
            "weights": [
                WeightEntry(unit="OptimalForEvenCpuDistribution", factor=1.5),
                WeightEntry(unit="OptimalForEvenMemoryDistribution", factor=0.1),
                WeightEntry(unit="PreferredHosts", factor=99),
            ],
        }
    )
    created = await admin.apply(
        PolicySet(policies=[doc], clusters=[ClusterAttachment(cluster_id=cluster, policy=name)])
    )
    assert created.changes[0].action is ChangeAction.CREATE
    assert "+ weight OptimalForEvenCpuDistribution factor 1.5" in created.changes[0].diff

    # Read back, exported as `vmsched policy export` writes it, read as `apply -f` reads it: equal,
    # written as the administrator wrote it (99, not 99.0), and applying it again changes nothing.
    stored = (await admin.read([name])).policies[0]
    assert stored.document == doc
    text = dump_set(PolicySet(policies=[stored.document]))
    for written in ("factor: 1.5\n", "factor: 0.1\n", "factor: 99\n"):
        assert written in text
    path = tmp_path / "exported.yaml"
    path.write_text(text)
    again = await admin.apply(read_set(str(path)))
    assert [(c.action, c.diff) for c in again.changes] == [(ChangeAction.UNCHANGED, [])]

    # The next decision weighs with the decimal factors.
    d = await client.schedule(cluster, factories.vm_spec(f"{unique}-a", mem_mb=512, vcpus=1), explain_scores=True)
    assert d.policy == name
    assert d.explanation.scores is not None
    factors = {u.unit: u.factor for u in d.explanation.scores.units}
    assert (factors["OptimalForEvenCpuDistribution"], factors["OptimalForEvenMemoryDistribution"]) == (1.5, 0.1)

    changed = doc.model_copy(update={"weights": [WeightEntry(unit="OptimalForEvenCpuDistribution", factor=2.25)]})
    updated = await admin.apply(PolicySet(policies=[changed]))
    assert "~ weight OptimalForEvenCpuDistribution factor 1.5 -> 2.25" in updated.changes[0].diff
    rolled = await admin.rollback(name)
    assert rolled.changes[0].version == 3
    history = await admin.history(name)
    assert [v.version for v in history.versions] == [3, 2, 1]
    assert history.versions[0].document == history.versions[2].document == doc
    assert (await admin.read([name])).policies[0].document == doc

    await admin.detach(cluster)
    await admin.delete(name)
