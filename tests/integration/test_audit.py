"""The audit trail: every policy write and destructive action an administrator does is a row of
audit_log with its actor (the AMQP user the broker vouched for), and every policy version names its
author; refused and failed writes leave no row. On both buses, with the real PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from tests import factories
from tests.integration.conftest import ON_BOTH_BUSES, Buses, services
from tests.servers import amqp_user
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import (
    AuditEntry,
    ClusterAttachment,
    FilterEntry,
    HostReport,
    HostStatus,
    PolicyDocument,
    PolicySet,
)
from vmsched.db import migrate
from vmsched.errors import RemoteError
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]


@pytest.fixture(scope="module")
async def stack(bus_settings: Settings, buses: Buses, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = bus_settings.model_copy(update={"postgres_url": database})
    async with services(cfg, "state-tracker", "filter-worker", "policy-admin", bus=buses):
        yield cfg


@pytest.fixture
async def admin(stack: Settings, buses: Buses) -> AsyncIterator[PolicyClient]:
    async with buses(stack, "admin") as bus:
        yield PolicyClient(stack, bus=bus)


@pytest.fixture
def me(stack: Settings) -> str:
    """The tests' AMQP user: an administrator (tests/conftest.py)."""
    return amqp_user(stack.amqp_url)


async def _entries(admin: PolicyClient, *targets: str, **query: object) -> list[AuditEntry]:
    """The audit rows about `targets`, oldest first (other tests write rows of their own)."""
    listing = await admin.audit(limit=10_000, **query)  # type: ignore[arg-type]  # the filters, by name
    return [e for e in reversed(listing.entries) if e.target in targets]


async def test_every_policy_write_is_recorded_with_its_actor_and_each_version_with_its_author(
    admin: PolicyClient, me: str, unique: str
) -> None:
    name, cluster = f"aud-{unique}", f"aud-{unique}"
    cloned = await admin.clone("none", name)
    doc = cloned.document.model_copy(update={"description": "edited"})
    await admin.apply(PolicySet(policies=[doc], clusters=[ClusterAttachment(cluster_id=cluster, policy=name)]))
    await admin.rollback(name)
    await admin.detach(cluster)
    history = await admin.history(name)
    assert [(v.version, v.author) for v in history.versions] == [(3, me), (2, me), (1, me)]
    await admin.delete(name)

    rows = await _entries(admin, name, cluster)
    assert [(e.action, e.target) for e in rows] == [
        ("policy.cloned", name),
        ("policy.updated", name),
        ("cluster.attached", cluster),
        ("policy.rolled-back", name),
        ("cluster.detached", cluster),
        ("policy.deleted", name),
    ]
    assert {e.actor for e in rows} == {me}
    assert rows[0].details == {"source": "none", "version": 1}
    assert rows[1].details["version"] == 2
    assert rows[1].details["diff_lines"] == len(rows[1].details["diff"]) >= 1
    assert rows[2].details == {"policy": name, "properties": {}, "ha_reservation": False}
    assert (rows[3].details["version"], rows[3].details["to"]) == (3, 1)
    assert rows[5].details["version"] == 3


async def test_built_in_versions_name_no_author(admin: PolicyClient) -> None:
    assert {v.author for v in (await admin.history("none")).versions} == {None}


async def test_refused_writes_and_no_op_changes_leave_no_row(admin: PolicyClient, unique: str) -> None:
    name, cluster = f"noop-{unique}", f"noop-{unique}"
    bad = PolicyDocument(name=name, filters=[FilterEntry(unit="NoSuchUnit")])
    with pytest.raises(RemoteError) as refused:
        await admin.apply(PolicySet(policies=[bad]))
    assert refused.value.remote_code == "invalid_policy"
    assert (await admin.detach(cluster)).changes[0].action.value == "unchanged"  # nothing to detach
    assert await _entries(admin, name, cluster) == []


async def test_removals_and_requeues_are_recorded_with_ids_counts_and_reason(
    stack: Settings, buses: Buses, admin: PolicyClient, me: str, unique: str
) -> None:
    cluster = f"rm-{unique}"
    async with buses.client(stack) as engine:
        h0, h1 = await factories.make_cluster(engine, cluster, 2, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)
        removal = await engine.remove_hosts(cluster, [h1, h1], reason="decommissioned")
        assert removal.host_ids == [h1]
        await _dead_letter_one(engine, cluster, h0)
        letters = await factories.eventually(
            lambda: _letters_of(engine, cluster), bool, "the misrouted report is dead-lettered"
        )
        gone = await engine.remove_cluster(cluster, reason="retired")
    requeued = await admin.requeue_dead_letters([letters[0], "nosuch-letter"])
    assert (requeued.requeued, requeued.not_found) == ([letters[0]], ["nosuch-letter"])

    rows = await _entries(admin, cluster, c.DEAD_LETTER_QUEUE, actor=me)
    hosts, cluster_row = [e for e in rows if e.target == cluster]
    assert (hosts.action, hosts.details) == (
        "hosts.removed",
        {"host_ids": [h1], "count": 1, "reason": "decommissioned"},
    )
    assert hosts.id == removal.audit_id
    assert (cluster_row.action, cluster_row.details, cluster_row.id) == (
        "cluster.removed",
        {"reason": "retired"},
        gone.audit_id,
    )
    [requeue] = [e for e in rows if e.target == c.DEAD_LETTER_QUEUE and letters[0] in e.details["requeued"]]
    assert requeue.action == "dead-letters.requeued"
    assert requeue.details["asked"] == [letters[0], "nosuch-letter"]
    assert (requeue.details["requeued_count"], requeue.details["skipped_count"]) == (1, 0)
    assert requeue.details["not_found"] == ["nosuch-letter"]


async def _dead_letter_one(engine: SchedulerClient, cluster: str, host: str) -> None:
    """A report filed under another cluster's routing key: the state tracker dead-letters it."""
    report = HostReport(
        cluster_id=cluster, host_id=host, status=HostStatus.UP, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192
    )
    await engine.bus.publish(c.host_report_key(f"{cluster}-elsewhere"), report)


async def _letters_of(engine: SchedulerClient, cluster: str) -> list[str]:
    return [d.id for d in await engine.bus.dead_letters(limit=10_000) if f"{cluster}-elsewhere" in d.routing_key]


async def test_the_log_is_read_newest_first_and_filtered(admin: PolicyClient, me: str, unique: str) -> None:
    before = datetime.now(UTC)
    first, second = f"f1-{unique}", f"f2-{unique}"
    await admin.clone("none", first)
    await admin.clone("none", second)
    newest = (await admin.audit(limit=2, action="policy.cloned", since=before)).entries
    assert [e.target for e in newest] == [second, first]
    assert newest[0].id > newest[1].id
    assert (await admin.audit(limit=1, actor=f"nobody-{unique}")).entries == []
    assert all(e.action == "policy.cloned" for e in (await admin.audit(limit=50, action="policy.cloned")).entries)
    for name in (first, second):
        await admin.delete(name)
