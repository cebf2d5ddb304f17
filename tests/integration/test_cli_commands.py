"""The `vmsched` command against running services on the real servers: each command runs as the
operator runs it (a process of its own, configured by VMSCHED_* variables), and its output and exit
code are what is checked."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import aio_pika
import pytest
import redis.asyncio as aioredis

from tests.factories import host_report, vm_report
from tests.integration.conftest import services
from tests.servers import amqp_user
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import ClusterAttachment, ClusterReport
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.errors import RemoteError
from vmsched.policy_client import PolicyClient
from vmsched.settings import Settings
from vmsched.store import PendingStore
from vmsched_services.tools.cli import EXIT_ERROR, EXIT_NOT_FOUND, EXIT_OK, EXIT_UNPLACEABLE

pytestmark = pytest.mark.integration

T = TypeVar("T")

host = partial(host_report, cpu_cores=8, physical_mem_mb=65536, mem_free_mb=60000)
ha_vm = partial(vm_report, mem_mb=4096, vcpus=2, mem_usage_pct=100.0, cpu_usage_pct=10.0, ha=True)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
async def stack(settings: Settings, database: str) -> AsyncIterator[Settings]:
    await migrate(database)
    cfg = settings.model_copy(update={"postgres_url": database, "ha_interval_s": 3600.0})
    async with services(cfg, "state-tracker", "filter-worker", "weigher", "selector", "ha-monitor", "policy-admin"):
        yield cfg


async def vmsched(cfg: Settings, *argv: str) -> Result:
    """Run `vmsched ARGV...` as a process of its own with the stack's settings in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VMSCHED_")}
    env.update(
        {
            "VMSCHED_AMQP_URL": cfg.amqp_url,
            "VMSCHED_REDIS_URL": cfg.redis_url,
            "VMSCHED_POSTGRES_URL": cfg.postgres_url,
            "VMSCHED_AMQP_PREFIX": cfg.amqp_prefix,
            "VMSCHED_REDIS_PREFIX": cfg.redis_prefix,
            "VMSCHED_RPC_TIMEOUT_S": "10",
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vmsched_services.tools.cli",
        *argv,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    result = Result(proc.returncode, out.decode(), err.decode())
    assert "Traceback" not in result.err, result.err
    return result


async def eventually(probe: Callable[[], Awaitable[T]], what: str, timeout: float = 30.0) -> T:
    """`probe()`'s first truthy answer, tried every 0.2 s."""
    for _ in range(int(timeout / 0.2)):
        got = await probe()
        if got:
            return got
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout:g} s")


async def report_cluster(client: SchedulerClient, cluster: str, hosts: list[str]) -> None:
    await client.report_cluster(ClusterReport(cluster_id=cluster))
    for h in hosts:
        await client.report_host(host(cluster, h))
    await client.wait_for_state(cluster, hosts=len(hosts))


def vm_file(tmp_path: Path, vm_id: str, mem_mb: int) -> str:
    path = tmp_path / f"{vm_id}.json"
    path.write_text(json.dumps({"vm_id": vm_id, "mem_mb": mem_mb, "vcpus": 1}))
    return str(path)


async def test_schedule_then_decisions_then_explain(
    client: SchedulerClient, stack: Settings, unique: str, tmp_path: Path
) -> None:
    cluster = f"cli-{unique}"
    await report_cluster(client, cluster, ["h1", "h2"])

    placed = await vmsched(stack, "schedule", "--cluster", cluster, "--vm", vm_file(tmp_path, "small", 1024), "--json")
    assert placed.code == EXIT_OK, placed.err
    placed_id = json.loads(placed.out)["request_id"]
    too_big = await vmsched(stack, "schedule", "--cluster", cluster, "--vm", vm_file(tmp_path, "huge", 1 << 30))
    assert too_big.code == EXIT_UNPLACEABLE, too_big.err
    assert "UNPLACEABLE" in too_big.out

    listed = await vmsched(stack, "decisions", "--cluster", cluster, "--json")
    assert listed.code == EXIT_OK, listed.err
    decisions = json.loads(listed.out)
    assert [(d["vm_id"], d["status"]) for d in decisions] == [("huge", "unplaceable"), ("small", "placed")]
    assert decisions[1]["request_id"] == placed_id
    table = await vmsched(stack, "decisions", "--cluster", cluster, "--limit", "1")
    assert table.code == EXIT_OK
    assert "huge" in table.out
    assert "small" not in table.out

    explained = await vmsched(stack, "explain", placed_id, "--cluster", cluster)
    assert explained.code == EXIT_OK, explained.err
    assert f"request {placed_id}" in explained.out

    nothing = await vmsched(stack, "decisions", "--cluster", f"none-{unique}")
    assert nothing.code == EXIT_NOT_FOUND
    assert nothing.err.startswith(f"vmsched: no decisions stored for cluster none-{unique}")


async def test_scheduling_on_an_unknown_cluster_says_so_plainly(stack: Settings, unique: str, tmp_path: Path) -> None:
    result = await vmsched(stack, "schedule", "--cluster", f"nope-{unique}", "--vm", vm_file(tmp_path, "v", 512))
    assert result.code == EXIT_ERROR
    lines = result.err.splitlines()
    assert lines[0] == f"vmsched: unknown_cluster: cluster nope-{unique} is unknown: no state has been reported for it"
    assert "`vmsched clusters list` shows the clusters with state" in lines[1]
    # Nothing found: exit 1, whichever service answered; `schedule`'s 1 says "no host", so it keeps 3.
    state = await vmsched(stack, "state", "--cluster", f"nope-{unique}")
    assert state.code == EXIT_NOT_FOUND
    assert state.err.startswith(f"vmsched: unknown_cluster: cluster nope-{unique} is unknown")
    ha = await vmsched(stack, "ha-check", "--cluster", f"nope-{unique}")
    assert ha.code == EXIT_NOT_FOUND, ha.out
    assert ha.err.startswith(f"vmsched: unknown_cluster: cluster nope-{unique} is unknown")
    policy = await vmsched(stack, "policy", "show", f"nope-{unique}")
    assert policy.code == EXIT_NOT_FOUND
    assert "policy_not_found" in policy.err
    assert "`vmsched policy list` shows the policies" in policy.err


async def test_ha_check_passes_is_off_or_fails_with_exit_1(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    cluster = f"ha-{unique}"
    await report_cluster(client, cluster, ["h1"])
    off = await vmsched(stack, "ha-check", "--cluster", cluster)
    assert off.code == EXIT_OK, off.err
    assert "HA reservation is off" in off.out

    pool = await connect_pg(stack.postgres_url)
    try:
        await PolicyRepository(pool).set_cluster_policy(cluster, None, ha_reservation=True)
    finally:
        await pool.close()
    await client.policy_changed(cluster_id=cluster)
    await client.report_vm(ha_vm(cluster, "v1", "h1"))  # a lone host's HA VM has nowhere to restart

    async def failing_now() -> list[str]:
        return (await client.ha_check(cluster)).failing_hosts

    await eventually(failing_now, "the HA monitor sees the VM")
    failing = await vmsched(stack, "ha-check", "--cluster", cluster)
    assert failing.code == EXIT_NOT_FOUND, failing.err
    assert "HA reservation check FAILED" in failing.out
    assert "host(s) h1" in failing.out

    await client.report_host(host(cluster, "h2"))
    await client.wait_for_state(cluster, hosts=2)
    passed = await vmsched(stack, "ha-check", "--cluster", cluster, "--json")
    assert passed.code == EXIT_OK, passed.err
    assert json.loads(passed.out)["ok"] is True


async def test_hosts_remove_drops_them_from_the_state(client: SchedulerClient, stack: Settings, unique: str) -> None:
    cluster = f"rm-{unique}"
    await report_cluster(client, cluster, ["h1", "h2", "h3"])
    result = await vmsched(stack, "hosts", "remove", "--cluster", cluster, "h2", "gone", "--reason", "decommissioned")
    assert result.code == EXIT_NOT_FOUND  # one of them was not there
    # The version after the cluster's reports (those that waited together share one) and the removal.
    assert re.match(rf"removed h2 from cluster {cluster} \(state version \d+\)", result.out), result.out
    assert f"not in cluster {cluster}: gone" in result.err
    assert "recorded in the audit log as entry " in result.out
    assert [h.report.host_id for h in (await client.state(cluster)).hosts] == ["h1", "h3"]

    none = await vmsched(stack, "hosts", "remove", "--cluster", cluster, "gone")
    assert none.code == EXIT_NOT_FOUND
    assert none.err.startswith(f"vmsched: cluster {cluster} has no host gone")


async def test_clusters_remove_deletes_state_and_pending(
    client: SchedulerClient, stack: Settings, redis_client: aioredis.Redis, unique: str, tmp_path: Path
) -> None:
    cluster = f"gone-{unique}"
    await report_cluster(client, cluster, ["h1"])
    placed = await vmsched(stack, "schedule", "--cluster", cluster, "--vm", vm_file(tmp_path, "v1", 1024))
    assert placed.code == EXIT_OK, placed.err
    pending = PendingStore(redis_client, stack)
    assert [e.vm_id for e in await pending.read(cluster)] == ["v1"]
    listed = await vmsched(stack, "clusters", "list", "--json")
    assert cluster in json.loads(listed.out)

    unconfirmed = await vmsched(stack, "clusters", "remove", cluster)  # no terminal to ask at, no --yes
    assert unconfirmed.code == 2
    assert "needs confirmation" in unconfirmed.err

    removed = await vmsched(stack, "clusters", "remove", cluster, "--yes")
    assert removed.code == EXIT_OK, removed.err
    assert removed.out.startswith(f"removed cluster {cluster}")
    assert "policy link in PostgreSQL is kept" in removed.out
    entry = int(removed.out.rsplit("recorded in the audit log as entry ", 1)[1])
    audit = await vmsched(stack, "audit", "--action", "cluster.removed", "--json")
    assert audit.code == EXIT_OK, audit.err
    assert {"id": entry, "target": cluster, "actor": amqp_user(stack.amqp_url)}.items() <= next(
        e for e in json.loads(audit.out) if e["id"] == entry
    ).items()
    with pytest.raises(RemoteError) as info:
        await client.state(cluster)
    assert info.value.remote_code == "unknown_cluster"
    assert await pending.read(cluster) == []
    assert cluster not in json.loads((await vmsched(stack, "clusters", "list", "--json")).out)

    again = await vmsched(stack, "clusters", "remove", cluster, "--yes")
    assert again.code == EXIT_NOT_FOUND
    assert again.err.startswith("vmsched: unknown_cluster: ")


async def test_dead_letters_list_show_and_requeue(stack: Settings, unique: str) -> None:
    """A report the state tracker cannot read: listed, shown with why, and sent back (where it is
    refused again, as a new dead letter)."""
    cluster = f"dl-{unique}"
    body = json.dumps({"cluster_id": cluster, "host_id": "h1", "status": "sideways"}).encode()
    conn = await aio_pika.connect(stack.amqp_url)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        events = await ch.get_exchange(f"{stack.amqp_prefix}{c.EVENTS_EXCHANGE}", ensure=False)
        await events.publish(
            aio_pika.Message(body, content_type="application/json", type="HostReport"),
            routing_key=c.host_report_key(cluster),
        )

    async def ours() -> list[dict[str, object]]:
        listed = await vmsched(stack, "dead-letters", "list", "--limit", "1000", "--json")
        assert listed.code == EXIT_OK, listed.err
        return [d for d in json.loads(listed.out) if d["routing_key"] == c.host_report_key(cluster)]

    [letter] = await eventually(ours, "the bad report is dead-lettered")
    assert letter["service"]  # the state tracker's process (in-process services here: "all")
    assert letter["queue"] == f"{stack.amqp_prefix}{c.STATE_EVENTS_QUEUE}"
    assert "status" in str(letter["reason"])

    shown = await vmsched(stack, "dead-letters", "show", str(letter["id"]))
    assert shown.code == EXIT_OK, shown.err
    assert f"dead letter {letter['n']} (id {letter['id']})" in shown.out
    assert f"by {letter['service']}" in shown.out
    assert f"routing key {c.host_report_key(cluster)}" in shown.out
    assert "requeue        possible" in shown.out
    assert '"status": "sideways"' in shown.out
    by_number = await vmsched(stack, "dead-letters", "show", str(letter["n"]))
    assert by_number.out == shown.out

    missing = await vmsched(stack, "dead-letters", "show", uuid.uuid4().hex[:12])
    assert missing.code == EXIT_NOT_FOUND

    requeued = await vmsched(stack, "dead-letters", "requeue", str(letter["id"]))
    assert requeued.code == EXIT_OK, requeued.err
    assert requeued.out == f"requeued 1: {letter['id']}\n"

    async def refused_again() -> list[dict[str, object]]:
        return [d for d in await ours() if d["id"] != letter["id"]]

    again = await eventually(refused_again, "the requeued report is refused again")
    assert len(again) == 1
    assert [d["id"] for d in await ours()] == [again[0]["id"]]  # the old one left the queue


async def test_policy_history_names_each_versions_author_and_audit_lists_who_did_what(
    stack: Settings, unique: str
) -> None:
    me, name = amqp_user(stack.amqp_url), f"cli-{unique}"
    cloned = await vmsched(stack, "policy", "clone", "none", name)
    assert cloned.code == EXIT_OK, cloned.err
    history = await vmsched(stack, "policy", "history", name)
    assert history.code == EXIT_OK, history.err
    assert history.out.startswith("version 1  ")
    assert history.out.splitlines()[0].endswith(f"  by {me}")
    built_in = await vmsched(stack, "policy", "history", "none")
    assert built_in.out.splitlines()[0].endswith("  by unknown")  # seeded, not stored by anyone

    listed = await vmsched(stack, "audit", "--actor", me, "--action", "policy.cloned", "--json")
    assert listed.code == EXIT_OK, listed.err
    [entry] = [e for e in json.loads(listed.out) if e["target"] == name]
    assert (entry["actor"], entry["details"]) == (me, {"source": "none", "version": 1})
    table = await vmsched(stack, "audit", "--action", "policy.cloned", "--limit", "1")
    assert table.out.splitlines()[0].split() == ["at", "(UTC)", "actor", "action", "target", "details"]
    assert f"  {me}" in table.out
    assert f"policy.cloned           {name}" in table.out
    nobody = await vmsched(stack, "audit", "--actor", f"nobody-{unique}")
    assert nobody.code == EXIT_NOT_FOUND
    assert nobody.err.startswith("vmsched: no audit log entries match")
    assert (await vmsched(stack, "policy", "delete", name)).code == EXIT_OK


async def test_policy_attach_refuses_an_unknown_cluster_and_keeps_what_it_is_not_told_to_change(
    client: SchedulerClient, stack: Settings, unique: str
) -> None:
    ghost, known = f"ghost-{unique}", f"att-{unique}"

    async def attachment(cluster: str) -> ClusterAttachment:
        async with PolicyClient(stack) as admin:
            return next(a for a in (await admin.read()).clusters if a.cluster_id == cluster)

    refused = await vmsched(stack, "policy", "attach", ghost, "evenly_distributed")
    assert refused.code == EXIT_NOT_FOUND, refused.err
    assert refused.err.startswith(f"vmsched: cluster {ghost} is unknown: no state has been reported for it")
    assert "pass --force" in refused.err
    forced = await vmsched(
        stack,
        "policy",
        "attach",
        ghost,
        "evenly_distributed",
        "--force",
        "--ha-reservation",
        "--set",
        "HighUtilization=75",
    )
    assert forced.code == EXIT_OK, forced.err
    # Attached now: known without --force, and an attach that names neither keeps both.
    again = await vmsched(
        stack, "policy", "attach", ghost, "evenly_distributed", "--set", "CpuOverCommitDurationMinutes=3"
    )
    assert again.code == EXIT_OK, again.err
    kept = await attachment(ghost)
    assert (kept.ha_reservation, kept.properties) == (
        True,
        {"HighUtilization": "75", "CpuOverCommitDurationMinutes": "3"},
    )
    off = await vmsched(stack, "policy", "attach", ghost, "evenly_distributed", "--no-ha-reservation")
    assert off.code == EXIT_OK, off.err
    assert f"HA reservation turned OFF for cluster {ghost} (it was on)" in off.err
    assert (await attachment(ghost)).ha_reservation is False

    await report_cluster(client, known, ["h1"])  # a cluster with state needs no --force
    reported = await vmsched(stack, "policy", "attach", known, "evenly_distributed")
    assert reported.code == EXIT_OK, reported.err
    for cluster in (ghost, known):
        assert (await vmsched(stack, "policy", "detach", cluster)).code == EXIT_OK


async def test_hosts_register_publishes_a_files_hosts_to_the_state(
    client: SchedulerClient, stack: Settings, unique: str, tmp_path: Path
) -> None:
    cluster = f"reg-{unique}"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(
        "hosts:\n"  # no cluster_id, no reported_at: --cluster's, and when the state tracker takes them
        "  - {host_id: h1, status: up, cpu_cores: 8, physical_mem_mb: 65536, mem_free_mb: 60000}\n"
        "  - {host_id: h2, status: maintenance, cpu_cores: 16, physical_mem_mb: 131072, mem_free_mb: 120000}\n"
    )
    result = await vmsched(stack, "hosts", "register", "--cluster", cluster, str(hosts))
    assert result.code == EXIT_OK, result.err
    assert result.out == f"published 2 host report(s) to cluster {cluster}\n"
    state = await client.wait_for_state(cluster, hosts=2)
    assert {(h.report.host_id, h.report.status.value) for h in state.hosts} == {("h1", "up"), ("h2", "maintenance")}
    assert {h.report.host_id: h.report.cpu_cores for h in state.hosts} == {"h1": 8, "h2": 16}
