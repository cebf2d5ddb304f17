"""The one home of the builders of test data, for unit, integration and e2e tests alike.

Plain messages: host_report, vm_report, vm_spec, pending_entry take the ids plus any field; a
field not given is the model's own default (HostReport's reserved_mem_mb is 321), except the
status, UP for hosts and RUNNING for VMs; schedule_decision is a VM placed on h1, decided now and
explained as "1/1 hosts available". A test module whose data shares other values states them
once, e.g. `host = partial(host_report, cpu_cores=16, physical_mem_mb=32_000, mem_free_mb=30_000)`.

make_cluster reports a cluster and its hosts through a SchedulerClient and waits until the state
tracker has them (integration and e2e tests; this module imports no client at run time, so unit
tests stay free of the bus).

Unit tests build HostTables in one line each:

    table(host("h1", mem_free_mb=2048), host("h2", cpu_cores=8), overcommit=150,
          pending=[pend("h1", mem_mb=512)])

The unit builders' defaults (host, pend, vm) describe a roomy, idle 4-core host with 4096 MB (no
reserved memory, so arithmetic in tests stays obvious); override only what a test is about.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from vmsched.contracts import (
    ClusterReport,
    DecisionStatus,
    Explanation,
    HostReport,
    HostState,
    HostStatus,
    PendingEntry,
    ScheduleDecision,
    ScheduleRequest,
    VmReport,
    VmSpec,
    VmStatus,
)
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.placement import LocalSteps, Placed, place
from vmsched.scheduling.placement import pending_entry as placed_entry
from vmsched.scheduling.policy import DEFAULT_POLICY
from vmsched.scheduling.units.base import FilterVerdict
from vmsched.store.generations import GenerationMarkers, Recover

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from vmsched.client import SchedulerClient
    from vmsched.settings import Settings
    from vmsched.store.keys import Keys

CLUSTER = "c1"
#: Disruption budgets no test of a balance unit's own behaviour runs into (the defaults allow a
#: quarter of a cluster's hosts' migrations an hour: one on a two-host cluster).
WIDE_BUDGETS = {"MigrationsPerHostPerHour": "100", "MigrationsPerClusterPerHour": "100", "ConcurrentMigrations": "10"}

_REPORT_FIELDS = set(HostReport.model_fields)
_STATE_FIELDS = set(HostState.model_fields) - {"report"}


def host_report(cluster_id: str, host_id: str, **kw: Any) -> HostReport:
    """An UP host; the capacity fields (cpu_cores, physical_mem_mb, mem_free_mb) are the caller's."""
    fields: dict[str, Any] = {"cluster_id": cluster_id, "host_id": host_id, "status": HostStatus.UP}
    fields.update(kw)
    return HostReport.model_validate(fields)


def vm_report(
    cluster_id: str, vm_id: str, host_id: str | None, status: VmStatus = VmStatus.RUNNING, **kw: Any
) -> VmReport:
    """A VM in `status` on `host_id`; mem_mb and vcpus are the caller's."""
    fields: dict[str, Any] = {"cluster_id": cluster_id, "vm_id": vm_id, "host_id": host_id, "status": status}
    fields.update(kw)
    return VmReport.model_validate(fields)


def vm_spec(vm_id: str, **kw: Any) -> VmSpec:
    """A VM to schedule; mem_mb and vcpus are the caller's."""
    return VmSpec.model_validate({"vm_id": vm_id, **kw})


def pending_entry(
    vm_id: str,
    host_id: str,
    token: int,
    *,
    mem_mb: int = 1024,
    vcpus: int = 2,
    ttl: float = 60.0,
    expires_at: float | None = None,
    **kw: Any,
) -> PendingEntry:
    """A pending record under fencing token `token`, expiring `ttl` seconds from now (or at `expires_at`)."""
    return PendingEntry(
        vm_id=vm_id,
        host_id=host_id,
        mem_mb=mem_mb,
        vcpus=vcpus,
        request_id=uuid.uuid4(),
        fencing_token=token,
        expires_at=time.time() + ttl if expires_at is None else expires_at,
        **kw,
    )


def schedule_decision(
    cluster_id: str,
    request_id: uuid.UUID | None = None,
    host_id: str | None = "h1",
    *,
    vm_id: str | None = None,
    decided_at: datetime | None = None,
    explanation: Explanation | None = None,
    **kw: Any,
) -> ScheduleDecision:
    """A PLACED decision for `request_id` (a fresh one if None) on `host_id`, decided at `decided_at`
    (now if None); the VM id is derived from the request id unless given. Other fields go as given."""
    rid = uuid.uuid4() if request_id is None else request_id
    fields: dict[str, Any] = {
        "request_id": rid,
        "cluster_id": cluster_id,
        "vm_id": f"vm-{rid.hex[:6]}" if vm_id is None else vm_id,
        "status": DecisionStatus.PLACED,
        "host_id": host_id,
        "explanation": explanation or Explanation(summary="1/1 hosts available", candidates=1),
        "decided_at": datetime.now(UTC) if decided_at is None else decided_at,
        "elapsed_ms": 1.0,
    }
    fields.update(kw)
    return ScheduleDecision.model_validate(fields)


def first_generation(redis: aioredis.Redis, settings: Settings, keys: Keys | None = None) -> Recover:
    """The `recover` hook for store tests that are not about Redis losing data: a cluster without
    a generation marker is taken as seen for the first time (generation 0, no resync), which is
    what vmsched.recovery concludes when PostgreSQL's ledger has never seen the cluster."""
    markers = GenerationMarkers(redis, settings, keys=keys)

    async def recover(cluster_id: str) -> None:
        await markers.install(cluster_id, 0, resync=False)

    return recover


async def make_cluster(
    client: SchedulerClient,
    cluster: str,
    n: int,
    *,
    timeout: float = 30.0,
    vary: Callable[[int], Mapping[str, Any]] | None = None,
    **fields: Any,
) -> list[str]:
    """Report `cluster` with hosts {cluster}-h0..h{n-1}, each host_report(**fields, **vary(i)), and
    wait until the state tracker has them all; returns the host ids."""
    await client.report_cluster(ClusterReport(cluster_id=cluster))
    ids = [f"{cluster}-h{i}" for i in range(n)]
    for i, hid in enumerate(ids):
        await client.report_host(host_report(cluster, hid, **{**fields, **(vary(i) if vary else {})}))
    await client.wait_for_state(cluster, hosts=n, timeout=timeout)
    return ids


def host(host_id: str, **kw: Any) -> HostState:
    """A HostState; keyword arguments go to the HostReport or the HostState, whichever has the field."""
    unknown = set(kw) - _REPORT_FIELDS - _STATE_FIELDS
    if unknown:
        raise TypeError(f"unknown host fields {sorted(unknown)}")
    report: dict[str, Any] = {"cpu_cores": 4, "physical_mem_mb": 4096, "mem_free_mb": 4096, "reserved_mem_mb": 0}
    report.update({k: v for k, v in kw.items() if k in _REPORT_FIELDS})
    state = {k: v for k, v in kw.items() if k in _STATE_FIELDS}
    return HostState(report=host_report(CLUSTER, host_id, **report), **state)


def pend(host_id: str, mem_mb: int = 0, vcpus: int = 0, cpus_pinned: int = 0) -> PendingEntry:
    return pending_entry(
        f"pending-{uuid.uuid4().hex[:8]}",
        host_id,
        1,
        mem_mb=mem_mb,
        vcpus=vcpus,
        cpus_pinned=cpus_pinned,
        expires_at=1e12,
    )


def table(
    *hosts: HostState,
    overcommit: int = 100,
    threads: bool = False,
    pending: Iterable[PendingEntry] = (),
) -> HostTable:
    settings = ClusterReport(cluster_id=CLUSTER, memory_overcommit_pct=overcommit, count_threads_as_cores=threads)
    return HostTable.from_states(list(hosts), settings).with_pending(pending)


def hosts_n(n: int, **kw: Any) -> HostTable:
    """n identical hosts h0..h{n-1}."""
    return table(*(host(f"h{i}", **kw) for i in range(n)))


def vm(**kw: Any) -> VmSpec:
    """A 1024 MB (+64 MB overhead), 2-vCPU VM unless told otherwise."""
    spec: dict[str, Any] = {"vm_id": "vm1", "mem_mb": 1024, "vcpus": 2}
    spec.update(kw)
    return vm_spec(**spec)


def floats(values: Iterable[Any]) -> list[float]:
    """A unit's raw weights (or any numbers of an array) as plain floats, to compare with a list."""
    return [float(x) for x in values]


def kept(hosts: HostTable, verdict: FilterVerdict) -> list[str]:
    """The ids of the hosts a filter kept, in table order."""
    return [h for h, k in zip(hosts.ids, verdict.keep, strict=True) if k]


def reasons(hosts: HostTable, verdict: FilterVerdict) -> dict[str, str]:
    """Removed host id -> its reason; also checks there is exactly one reason per removed host."""
    removed = [h for h, k in zip(hosts.ids, verdict.keep, strict=True) if not k]
    assert len(removed) == len(verdict.reasons)
    return dict(zip(removed, verdict.reasons, strict=True))


# ---------------------------------------------------------------- TLS certificates (tests/integration/test_tls.py)
@dataclass(frozen=True)
class Certificates:
    """PEM files made at test time: a CA, a server certificate it signed (for 127.0.0.1 and localhost),
    a client certificate it signed (CN=postgres, so PostgreSQL's clientcert=verify-full would take it
    too), and a second CA that signed none of them (the "wrong CA")."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def certificates(directory: Path) -> Certificates:
    """Make the certificates with the openssl command (no Python dependency); one second or so."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    def ca(name: str) -> None:
        openssl(
            *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=vmsched test {name}"),
            *("-keyout", f"{name}.key", "-out", f"{name}.pem"),
        )

    def signed(name: str, cn: str, extensions: str) -> None:
        (directory / f"{name}.ext").write_text(extensions)
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={cn}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        openssl(
            *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"),
            *("-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem"),
        )

    ca("ca")
    ca("other-ca")
    signed("server", "localhost", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    signed("client", "postgres", "extendedKeyUsage=clientAuth\n")
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return Certificates(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        other_ca=directory / "other-ca.pem",
    )


T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], what: str = "the condition", timeout: float = 30.0
) -> T:
    """`probe()`'s first answer `done` accepts, asked every 0.05 s (the services apply what a test
    sent asynchronously); AssertionError naming `what` when none does within `timeout` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        got = await probe()
        if done(got):
            return got
        if loop.time() > end:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {got!r})")
        await asyncio.sleep(0.05)


async def placed_one_at_a_time(table: HostTable, vms: list[VmSpec]) -> Counter[str]:
    """How many of `vms` each host gets when they are placed one after another in process with the
    default policy, each seeing the earlier ones pending: what a group must come to."""
    steps = LocalSteps.of(table, DEFAULT_POLICY)
    pending: list[PendingEntry] = []
    hosts: Counter[str] = Counter()
    for vm in vms:
        req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c", vm=vm)

        def pending_for(v: VmSpec, host_id: str) -> PendingEntry:
            return placed_entry(v, host_id, request_id=uuid.uuid4(), fencing_token=1, expires_at=1e12)

        outcome = await place(
            req,
            DEFAULT_POLICY.filter_names(),
            list(table.ids),
            pending,
            filter_fn=steps.filter,
            weigh_fn=steps.weigh,
            pending_for=pending_for,
            may_wait=False,
        )
        assert isinstance(outcome, Placed)
        pending.extend(outcome.pending)
        hosts[outcome.placements[0].host_id] += 1
    return hosts
