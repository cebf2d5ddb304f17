"""What the bench measures on: generated hosts and VMs, and the policies it runs."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

from vmsched.contracts import HostReport, HostStatus, VmSpec
from vmsched.scheduling.policy import DEFAULT_POLICY, FilterSequence, Policy, PolicyFilter, PolicyWeight
from vmsched.scheduling.units import BUILTIN_UNITS


def host_reports(rng: random.Random, cluster: str, n: int) -> list[HostReport]:
    return [
        HostReport(
            cluster_id=cluster,
            host_id=f"{cluster}-h{i:05d}",
            status=HostStatus.UP,
            cpu_cores=rng.choice([16, 32, 64]),
            cpu_threads=128,
            cpu_usage_pct=round(rng.uniform(0, 60), 1),
            physical_mem_mb=rng.choice([131072, 262144, 524288]),
            mem_free_mb=rng.choice([65536, 131072]),
            networks=["ovirtmgmt", "vmnet"] + (["storage"] if rng.random() < 0.8 else []),
            disk_total_mb=2_000_000,
            disk_free_mb=1_000_000,
            reported_at=datetime.now(UTC),
        )
        for i in range(n)
    ]


def catalogue_policy() -> Policy:
    """Every built-in filter and weight unit, factor 1: what the whole catalogue costs (plugins
    installed here are left out, so the numbers compare across installations).

    ClusterInMaintenance is left out: it is a mode (only HA VMs start), not a constraint a
    policy combines with others, and it would stop every bench VM.
    """

    return Policy(
        id=uuid.uuid5(uuid.NAMESPACE_URL, "vmsched:bench-catalogue"),
        name="bench-catalogue",
        filters=tuple(
            PolicyFilter(unit=u.name, sequence=FilterSequence.FIRST if u.name == "Migration" else FilterSequence.NONE)
            for u in BUILTIN_UNITS
            if u.filter is not None and u.name != "ClusterInMaintenance"
        ),
        weights=tuple(PolicyWeight(unit=u.name) for u in BUILTIN_UNITS if u.weight is not None),
    )


def policies() -> dict[str, Policy]:
    return {"none": DEFAULT_POLICY, "catalogue": catalogue_policy()}


def vm_spec(rng: random.Random, i: int) -> VmSpec:
    return VmSpec(
        vm_id=f"bench-vm{i:06d}",
        mem_mb=rng.choice([1024, 2048, 4096]),
        vcpus=rng.choice([1, 2, 4]),
        networks=["vmnet", "storage"] if rng.random() < 0.5 else ["vmnet"],
    )


__all__ = ["catalogue_policy", "host_reports", "policies", "vm_spec"]
