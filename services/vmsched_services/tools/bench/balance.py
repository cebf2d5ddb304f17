"""One balancer pass per built-in balance unit, timed on one large generated cluster."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from vmsched.contracts import ClusterReport, HostReport, HostState, HostStatus, PendingEntry, VmReport, VmStatus
from vmsched.scheduling.host_aggregates import aggregate_host
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.properties import HA_RESERVATION_PROPERTY, HOSTS_IN_RESERVE_PROPERTY, POWER_MANAGEMENT_PROPERTY
from vmsched.scheduling.units import BUILTIN_UNITS, validate_properties
from vmsched.scheduling.units.base import BalanceFn, BalanceOutcome
from vmsched_services.tools.bench.timing import best_ms

#: The largest cluster the balance pass is measured on.
BALANCE_HOSTS_MAX = 10_000

#: Balance units and the policy properties the bench runs them with: power management and HA
#: reservation on, so those units have something to decide.
_BALANCE_PROPS: dict[str, str] = {
    POWER_MANAGEMENT_PROPERTY: "true",
    HOSTS_IN_RESERVE_PROPERTY: "2",
    HA_RESERVATION_PROPERTY: "true",
}
_BALANCE_NOW = 1_700_000_000.0
#: MaxFreeMemoryForOverUtilized above any bench host's memory: every host short, none a destination.
_NO_FIT_MB = "1000000"


def _balance_cluster(
    n_hosts: int, n_vms: int, seed: int
) -> tuple[list[HostState], list[VmReport], list[PendingEntry], ClusterReport]:
    """A cluster the balance units find work in: 2% of the hosts over HighUtilization (80%) for
    10 minutes, 10% under LowUtilization (20%), a few empty; a fifth of the VMs HA; 1% of the VMs
    pending (placed, not yet running), the rest movable. Every host reports 10 one-minute samples."""
    rng = random.Random(seed)
    vms: list[VmReport] = []
    per_host: list[list[VmReport]] = [[] for _ in range(n_hosts)]
    empty = set(rng.sample(range(n_hosts), min(n_hosts, max(1, n_hosts // 500))))
    occupied = [i for i in range(n_hosts) if i not in empty] or [0]
    for j in range(n_vms):
        i = rng.choice(occupied)
        vm = VmReport(
            cluster_id="balance",
            vm_id=f"vm{j:07d}",
            status=VmStatus.RUNNING,
            host_id=f"h{i:05d}",
            mem_mb=rng.choice([1024, 2048, 4096, 8192]),
            vcpus=rng.choice([1, 2, 4]),
            cpu_usage_pct=round(rng.uniform(0, 100), 1),
            mem_usage_pct=round(rng.uniform(10, 100), 1),
            ha=rng.random() < 0.2,
        )
        vms.append(vm)
        per_host[i].append(vm)
    hosts = []
    for i, on in enumerate(per_host):
        kind = rng.random()
        level = rng.uniform(85, 99) if kind < 0.02 else rng.uniform(2, 18) if kind < 0.12 else rng.uniform(25, 70)
        band = (80.0, 100.0) if kind < 0.02 else (0.0, 19.9) if kind < 0.12 else (0.0, 100.0)
        cpu_samples = [
            (_BALANCE_NOW - 60.0 * (9 - k), round(min(band[1], max(band[0], level + rng.uniform(-5, 5))), 1))
            for k in range(10)
        ]
        report = HostReport(
            cluster_id="balance",
            host_id=f"h{i:05d}",
            status=HostStatus.UP,
            cpu_cores=rng.choice([32, 64, 128]),
            physical_mem_mb=rng.choice([262144, 524288]),
            mem_free_mb=65536,
            cpu_usage_pct=cpu_samples[-1][1],
            is_spm=i == 0,
        )
        # As the state tracker aggregates a host's VMs.
        hosts.append(aggregate_host(report, on, cpu_samples))
    in_flight = rng.sample(vms, n_vms // 100)
    pending = [
        PendingEntry(
            vm_id=v.vm_id,
            host_id=f"h{rng.choice(occupied):05d}",
            mem_mb=v.mem_mb + v.overhead_mb,
            vcpus=v.vcpus,
            request_id=uuid.UUID(int=rng.getrandbits(128)),
            fencing_token=1,
            expires_at=_BALANCE_NOW + 60,
        )
        for v in in_flight
    ]
    flying = {v.vm_id for v in in_flight}
    return hosts, [v for v in vms if v.vm_id not in flying], pending, ClusterReport(cluster_id="balance")


def _balance_table(hosts: list[HostState], settings: ClusterReport, pending: list[PendingEntry]) -> HostTable:
    """The table the balancer builds for a pass: the state's hosts with the pending records folded in."""
    return HostTable.from_states(hosts, settings).with_pending(pending, now=_BALANCE_NOW)


def bench_balance(seed: int, n_hosts: int = 10_000, n_vms: int = 200_000) -> dict[str, Any]:
    """One balancer pass per built-in balance unit, as the balancer runs it (HostTable.from_states +
    with_pending + unit.balance), best of 3, on one cluster built once: as the cluster is, and with
    nothing fitting anywhere (no_fit_ms); with the table alone."""
    hosts, movable, pending, settings = _balance_cluster(n_hosts, n_vms, seed)
    table = partial(_balance_table, hosts, settings, pending)
    units: dict[str, Any] = {}
    for unit in BUILTIN_UNITS:
        if unit.balance is None:
            continue
        props = validate_properties(unit, _BALANCE_PROPS)
        one_pass = partial(_balance_pass, unit.balance, table, movable, props)
        pass_ms = best_ms(one_pass)
        outcome = one_pass()
        # The worst case: every host short of memory, none with room to take a VM: the pass tries
        # every source and finds nothing (units without memory limits decide as above).
        no_fit = validate_properties(unit, {**_BALANCE_PROPS, "MaxFreeMemoryForOverUtilized": _NO_FIT_MB})
        walk = partial(_balance_pass, unit.balance, table, movable, no_fit)
        units[unit.name] = {
            "ms": pass_ms,
            "no_fit_ms": best_ms(walk),
            "migration": None if outcome.migration is None else outcome.migration.vm_id,
            "power": [p.action for p in outcome.power],
        }
    return {
        "hosts": n_hosts,
        "vms": n_vms,
        "movable": len(movable),
        "table_ms": best_ms(table),
        "units": units,
    }


def _balance_pass(
    balance: BalanceFn, table: Callable[[], HostTable], movable: list[VmReport], props: dict[str, str]
) -> BalanceOutcome:
    return balance(table(), movable, props)


__all__ = ["BALANCE_HOSTS_MAX", "bench_balance"]
