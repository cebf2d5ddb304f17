"""oVirt's HA VM reservation check: could every host's HA VMs restart on the other hosts?

Pure computation, no I/O. The HA monitor feeds it a state snapshot plus the pending records.

The model, per oVirt's HA reservation design (its monitoring task):

* Hosts: only Up hosts take part, ordered by host id. A host's free resources are
  - memory: its reported `mem_free_mb` minus the memory of the VMs pending on it. Pending is
    counted once: one record per VM (duplicates of a VM id: the last one counts), and a record
    whose VM is already reported RUNNING on that same host is skipped (the host's measured free
    memory already contains it);
  - CPU: `100 - cpu_usage_pct` percent. Pending VMs are not charged CPU: oVirt's check measures CPU
    *usage*, and a VM that has not started yet has none to measure.
* A host's CPUs are its cores, or its threads when the cluster counts threads as cores (threads
  reported as 0 fall back to cores), like HostTable.effective_cpus. A host with no CPUs (topology
  unknown) takes no VM, though its own HA VMs are still checked.
* HA VMs of a host: VMs with `ha` set, reported STARTING, RUNNING or MIGRATING on it (a migrating
  VM counts on the host it is reported on), ordered by VM id. Each needs
  - memory actually used: `floor(mem_mb * (mem_usage_pct / 100.0) + 0.5)` MB, oVirt's
    `Math.round(vm.getMemSizeMb() * (vm.getUsageMemPercent() / 100.0))`;
  - CPU share on target host y: `cpu_usage_pct * vcpus / cpus(y)` percent of y.
  A VM fits on y when y's free memory >= its memory and y's free CPU % >= its share on y; placing it
  subtracts both from y.
* Host x passes when all its HA VMs fit, first fit, on the other Up hosts' free resources (fresh for
  every x). A host without HA VMs passes; one Up host alone with HA VMs fails; no hosts passes.

`naive_failing_hosts` is oVirt's monitoring loop as designed (for x: for y != x: for v: place v on y
if it fits), O(hosts^2 x VMs): the baseline the fast version is checked against. `failing_hosts` is
VM-major first fit (each VM to the first host it fits on), which places every VM exactly where the
host-major loop does (the first host y takes, in order, every VM that fits it; the next host then
sees the rest in order; by induction both orders agree). It runs all hosts x at once as rows of a
(hosts-with-HA-VMs x hosts) matrix of free resources, one NumPy step per VM rank, so the Python work
is O(max HA VMs on one host) steps and the array work O(HA VMs x hosts). Both do the same
floating-point operations on the same values, so they agree exactly, not just approximately.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vmsched.contracts import HostState, HostStatus, PendingEntry, VmReport, VmStatus

#: VM statuses that put a VM on its host (as the state tracker counts them).
HA_VM_STATUSES: frozenset[VmStatus] = frozenset({VmStatus.STARTING, VmStatus.RUNNING, VmStatus.MIGRATING})

#: Rows x hosts cells the fast check keeps in one block of its free-resource matrices.
_BLOCK_CELLS = 4_000_000

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class HaResult:
    """The outcome of one check: failing host ids (sorted), Up hosts and HA VMs looked at."""

    failing_hosts: list[str]
    hosts: int
    ha_vms: int

    @property
    def ok(self) -> bool:
        return not self.failing_hosts


def alert_message(cluster_name: str, hosts: Sequence[str]) -> str:
    """oVirt's CLUSTER_ALERT_HA_RESERVATION alert text."""
    return (
        f"Cluster {cluster_name} failed the HA Reservation check, HA VMs on host(s): {', '.join(hosts)} "
        "will fail to migrate in case of a failover, consider adding resources or shutting down unused VMs."
    )


def recovery_message(cluster_name: str) -> str:
    return f"Cluster {cluster_name} passes the HA Reservation check again."


# ------------------------------------------------------------------------------------ shared model
def _cpus(host: HostState, count_threads_as_cores: bool) -> int:
    r = host.report
    if count_threads_as_cores and r.cpu_threads > 0:
        return r.cpu_threads
    return r.cpu_cores


def _up_hosts(hosts: Iterable[HostState]) -> list[HostState]:
    return sorted((h for h in hosts if h.report.status is HostStatus.UP), key=lambda h: h.report.host_id)


def _pending_mem(pending: Iterable[PendingEntry], vms: Sequence[VmReport]) -> dict[str, int]:
    """Pending memory per host, each VM counted once (see the module docstring)."""
    per_vm = {e.vm_id: e for e in pending}
    running_on = {v.vm_id: v.host_id for v in vms if v.status is VmStatus.RUNNING}
    mem: dict[str, int] = {}
    for e in per_vm.values():
        if running_on.get(e.vm_id) == e.host_id:
            continue
        mem[e.host_id] = mem.get(e.host_id, 0) + e.mem_mb
    return mem


def _ha_vms(vms: Iterable[VmReport], up: set[str]) -> dict[str, list[VmReport]]:
    by_host: dict[str, list[VmReport]] = {}
    for v in sorted(vms, key=lambda v: v.vm_id):
        if v.ha and v.status in HA_VM_STATUSES and v.host_id in up:
            by_host.setdefault(v.host_id, []).append(v)
    return by_host


def vm_mem_used(vm: VmReport) -> int:
    """Memory the VM actually uses, MB (oVirt's Math.round, halves rounded up)."""
    return math.floor(vm.mem_mb * (vm.mem_usage_pct / 100.0) + 0.5)


# ------------------------------------------------------------------------------------ naive loop
def naive_failing_hosts(
    hosts: Sequence[HostState],
    vms: Sequence[VmReport],
    pending: Iterable[PendingEntry] = (),
    *,
    count_threads_as_cores: bool = False,
) -> list[str]:
    """oVirt's monitoring loops, literally: failing host ids, sorted."""
    up = _up_hosts(hosts)
    pend = _pending_mem(pending, vms)
    ha = _ha_vms(vms, {h.report.host_id for h in up})
    failing: list[str] = []
    for x in up:
        x_id = x.report.host_id
        x_vms = ha.get(x_id, [])
        migrated = [False] * len(x_vms)
        for y in up:
            y_id = y.report.host_id
            cpus = _cpus(y, count_threads_as_cores)
            if y_id == x_id or cpus <= 0:
                continue
            free_mem = y.report.mem_free_mb - pend.get(y_id, 0)
            free_cpu = 100.0 - y.report.cpu_usage_pct
            for i, v in enumerate(x_vms):
                if migrated[i]:
                    continue
                mem = vm_mem_used(v)
                cpu = v.cpu_usage_pct * v.vcpus / cpus
                if free_mem >= mem and free_cpu >= cpu:
                    free_mem -= mem
                    free_cpu -= cpu
                    migrated[i] = True
        if not all(migrated):
            failing.append(x_id)
    return failing


# ------------------------------------------------------------------------------------ fast
def check(
    hosts: Sequence[HostState],
    vms: Sequence[VmReport],
    pending: Iterable[PendingEntry] = (),
    *,
    count_threads_as_cores: bool = False,
) -> HaResult:
    """The check, vectorized (see the module docstring); same answer as naive_failing_hosts."""
    up = _up_hosts(hosts)
    ids = [h.report.host_id for h in up]
    n = len(up)
    ha = _ha_vms(vms, set(ids))
    ha_count = sum(len(v) for v in ha.values())
    if not ha:
        return HaResult([], n, 0)
    pend = _pending_mem(pending, vms)
    free_mem = np.array([h.report.mem_free_mb - pend.get(h.report.host_id, 0) for h in up], dtype=np.float64)
    free_cpu = 100.0 - np.array([h.report.cpu_usage_pct for h in up], dtype=np.float64)
    cpus = np.array([_cpus(h, count_threads_as_cores) for h in up], dtype=np.float64)
    takes = cpus > 0
    cpus = np.where(takes, cpus, 1.0)  # no division by zero; such hosts are masked out below
    free_mem = np.where(takes, free_mem, -np.inf)

    # Candidate hosts x (those with HA VMs), most HA VMs first: at VM rank k the rows still
    # placing a VM are a prefix of the matrix, worked on as a view.
    index = {h: i for i, h in enumerate(ids)}
    cand = sorted(ha, key=lambda h: (-len(ha[h]), index[h]))
    failing: list[str] = []
    rows_per_block = max(1, _BLOCK_CELLS // max(1, n))
    for start in range(0, len(cand), rows_per_block):
        block = cand[start : start + rows_per_block]
        failed = _first_fit_block(block, ha, index, free_mem, free_cpu, cpus)
        failing += [h for h, f in zip(block, failed, strict=True) if f]
    return HaResult(sorted(failing), n, ha_count)


def failing_hosts(
    hosts: Sequence[HostState],
    vms: Sequence[VmReport],
    pending: Iterable[PendingEntry] = (),
    *,
    count_threads_as_cores: bool = False,
) -> list[str]:
    """Failing host ids, sorted: the fast version of naive_failing_hosts."""
    return check(hosts, vms, pending, count_threads_as_cores=count_threads_as_cores).failing_hosts


def _first_fit_block(
    block: list[str],
    ha: dict[str, list[VmReport]],
    index: dict[str, int],
    free_mem: FloatArray,
    free_cpu: FloatArray,
    cpus: FloatArray,
) -> npt.NDArray[np.bool_]:
    """First fit of each block host's HA VMs over the other hosts; True where a VM found no host.

    `block` is ordered by number of HA VMs, descending."""
    r = len(block)
    counts = np.array([len(ha[h]) for h in block], dtype=np.intp)
    k_max = int(counts[0])
    need_mem = np.zeros((r, k_max), dtype=np.float64)
    need_cpu = np.zeros((r, k_max), dtype=np.float64)
    for i, h in enumerate(block):
        vs = ha[h]
        m = np.array([v.mem_mb for v in vs], dtype=np.float64)
        p = np.array([v.mem_usage_pct for v in vs], dtype=np.float64)
        need_mem[i, : len(vs)] = np.floor(m * (p / 100.0) + 0.5)
        need_cpu[i, : len(vs)] = np.array([v.cpu_usage_pct for v in vs]) * np.array([v.vcpus for v in vs])
    fm = np.tile(free_mem, (r, 1))
    fc = np.tile(free_cpu, (r, 1))
    selves = np.array([index[h] for h in block], dtype=np.intp)
    rows = np.arange(r)
    fm[rows, selves] = -np.inf  # a host never takes its own VMs
    failed = np.zeros(r, dtype=np.bool_)
    # Rows still placing at rank k: counts is descending, so a prefix.
    active_until = np.searchsorted(-counts, -np.arange(1, k_max + 1), side="right")
    for k in range(k_max):
        a = int(active_until[k])
        m = need_mem[:a, k]
        c = need_cpu[:a, k]
        fit = fm[:a] >= m[:, None]
        fit &= fc[:a] >= c[:, None] / cpus
        first = fit.argmax(axis=1)
        ok = fit[rows[:a], first]
        failed[:a] |= ~ok
        placed = np.flatnonzero(ok)
        if placed.size:
            ys = first[placed]
            fm[placed, ys] -= m[placed]
            fc[placed, ys] -= c[placed] / cpus[ys]
        # A failed row keeps going (its answer is settled); blocking it would cost more than it saves.
    return failed


__all__ = [
    "HA_VM_STATUSES",
    "HaResult",
    "alert_message",
    "check",
    "failing_hosts",
    "naive_failing_hosts",
    "recovery_message",
    "vm_mem_used",
]
