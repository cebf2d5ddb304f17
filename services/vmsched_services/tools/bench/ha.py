"""oVirt's HA reservation check, timed: the fast version, and against the naive one."""

from __future__ import annotations

import random
from functools import partial
from typing import Any

from vmsched.contracts import HostReport, HostState, HostStatus, VmReport, VmStatus
from vmsched.scheduling.ha import check, naive_failing_hosts
from vmsched_services.tools.bench.timing import best_ms, seconds


def _ha_cluster(n_hosts: int, n_vms: int, seed: int, *, skew: bool = False) -> tuple[list[HostState], list[VmReport]]:
    rng = random.Random(seed)
    hosts = [
        HostState(
            report=HostReport(
                cluster_id="ha",
                host_id=f"h{i:05d}",
                status=HostStatus.UP,
                cpu_cores=rng.choice([8, 16, 32, 64]),
                physical_mem_mb=262144,
                mem_free_mb=rng.randint(20000, 120000),
                cpu_usage_pct=round(rng.uniform(0, 70), 1),
            )
        )
        for i in range(n_hosts)
    ]
    vms = [
        VmReport(
            cluster_id="ha",
            vm_id=f"vm{j:06d}",
            status=VmStatus.RUNNING,
            host_id=f"h{0 if skew and j % 2 == 0 else rng.randrange(n_hosts):05d}",
            mem_mb=rng.choice([1024, 2048, 4096, 8192]),
            vcpus=rng.choice([1, 2, 4]),
            cpu_usage_pct=round(rng.uniform(0, 100), 1),
            mem_usage_pct=round(rng.uniform(10, 100), 1),
            ha=True,
        )
        for j in range(n_vms)
    ]
    return hosts, vms


def bench_ha(seed: int) -> dict[str, Any]:
    """oVirt's HA reservation check: the fast version at 1,000 hosts / 20,000 HA VMs, and against the naive one."""

    out: dict[str, Any] = {}
    for label, skew in (("spread", False), ("half_on_one_host", True)):
        hosts, vms = _ha_cluster(1000, 20000, seed, skew=skew)
        out[f"fast_1000_hosts_20000_vms_{label}_ms"] = best_ms(partial(check, hosts, vms))
    hosts, vms = _ha_cluster(200, 4000, seed)
    naive = seconds(lambda: naive_failing_hosts(hosts, vms))
    fast = seconds(lambda: check(hosts, vms))
    out["naive_200_hosts_4000_vms_ms"] = round(naive * 1000, 1)
    out["fast_200_hosts_4000_vms_ms"] = round(fast * 1000, 1)
    out["agree_at_200_hosts"] = naive_failing_hosts(hosts, vms) == check(hosts, vms).failing_hosts
    return out


__all__ = ["bench_ha"]
