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
if it fits), O(hosts^2 x VMs): the baseline the fast version is checked against. `check` is VM-major
first fit (each VM to the first host it fits on), which places every VM exactly where the host-major
loop does (the first host y takes, in order, every VM that fits it; the next host then sees the rest
in order; by induction both orders agree). Each host x is a row of a (hosts-with-HA-VMs x hosts)
matrix of free resources, and:

* hosts that cannot take even the smallest HA VM are dropped as columns up front;
* while many rows are still placing, VM rank k is placed for all of them in one NumPy step, trying
  the first few columns first (first fit mostly lands there) and the rest only for rows that found
  nothing there;
* the few rows with many more HA VMs than the others (one host holding half the cluster's HA VMs)
  then finish one at a time, a chunk of VMs per NumPy step, walked in Python.

Every shortcut only skips columns that provably do not fit, and the fast path does the same
floating-point operations on the same values as the naive one, so they agree exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

import numpy as np
import numpy.typing as npt

from vmsched.contracts import HostState, HostStatus, PendingEntry, VmReport, VmStatus

#: VM statuses that put a VM on its host (as the state tracker counts them).
HA_VM_STATUSES: frozenset[VmStatus] = frozenset({VmStatus.STARTING, VmStatus.RUNNING, VmStatus.MIGRATING})

#: Rows x hosts cells the fast check keeps in one block of its free-resource matrices.
_BLOCK_CELLS = 4_000_000
#: Columns every row tries first when placing a rank of VMs for all rows at once.
_FIRST_COLUMNS = 32
#: Once this few rows are still placing, each finishes on its own (_first_fit_row).
_ROW_AT_A_TIME = 4
#: VMs whose fits _first_fit_row computes in one array step.
_CHUNK = 64

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
    if not per_vm:
        return {}  # the common case: no need to look at every VM
    running_on = {v.vm_id: v.host_id for v in vms if v.status is VmStatus.RUNNING and v.vm_id in per_vm}
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
@dataclass(frozen=True)
class _HaVmTable:
    """The HA VMs on Up hosts as columns, grouped by host (in host order), VM id order within a host."""

    host: npt.NDArray[np.intp]  # index of the VM's host among the Up hosts
    need_mem: FloatArray  # vm_mem_used, as floats (exact: every value is far below 2**53)
    need_cpu: FloatArray  # cpu_usage_pct * vcpus; divided by the target's CPUs where it is compared

    @classmethod
    def collect(cls, vms: Iterable[VmReport], index: dict[str | None, int]) -> _HaVmTable:
        # One pass over the VMs reading each field once: with tens of thousands of VMs the
        # per-attribute Python work is what costs, not the arrays.
        picked = [
            (v.vm_id, i, v.mem_mb, v.mem_usage_pct, v.cpu_usage_pct, v.vcpus)
            for v in vms
            if v.ha and v.status in HA_VM_STATUSES and (i := index.get(v.host_id)) is not None
        ]
        picked.sort(key=itemgetter(0))  # stable, like _ha_vms: duplicate ids keep their reported order
        if not picked:
            empty = np.zeros(0)
            return cls(np.zeros(0, dtype=np.intp), empty, empty)
        _, host, mem_mb, mem_pct, cpu_pct, vcpus = zip(*picked, strict=True)
        order = np.argsort(np.array(host, dtype=np.intp), kind="stable")  # by host, VM id order kept
        mem = np.array(mem_mb, dtype=np.float64)[order]
        pct = np.array(mem_pct, dtype=np.float64)[order]
        # The same operations, in the same order, as vm_mem_used and the naive loop's CPU share.
        need_mem = np.floor(mem * (pct / 100.0) + 0.5)
        need_cpu = np.array(cpu_pct, dtype=np.float64)[order] * np.array(vcpus, dtype=np.float64)[order]
        return cls(np.array(host, dtype=np.intp)[order], need_mem, need_cpu)


def check(
    hosts: Sequence[HostState],
    vms: Sequence[VmReport],
    pending: Iterable[PendingEntry] = (),
    *,
    count_threads_as_cores: bool = False,
) -> HaResult:
    """The check, vectorized (see the module docstring); same answer as naive_failing_hosts."""
    up = _up_hosts(hosts)
    n = len(up)
    index: dict[str | None, int] = {h.report.host_id: i for i, h in enumerate(up)}
    table = _HaVmTable.collect(vms, index)
    if not table.host.size:
        return HaResult([], n, 0)
    pend = _pending_mem(pending, vms)
    free_mem = np.array([h.report.mem_free_mb - pend.get(h.report.host_id, 0) for h in up], dtype=np.float64)
    free_cpu = 100.0 - np.array([h.report.cpu_usage_pct for h in up], dtype=np.float64)
    cpus = np.array([_cpus(h, count_threads_as_cores) for h in up], dtype=np.float64)

    cols = _useful_targets(free_mem, free_cpu, cpus, table)
    # Host i's column among the useful targets, or -1: a host never takes its own VMs.
    col_of = np.full(n, -1, dtype=np.intp)
    col_of[cols] = np.arange(cols.size)

    # Candidate hosts x (those with HA VMs), most HA VMs first: at VM rank k the rows still
    # placing a VM are a prefix of the matrix, worked on as a view.
    cand, starts, counts = np.unique(table.host, return_index=True, return_counts=True)
    order = np.lexsort((cand, -counts))
    cand, starts, counts = cand[order], starts[order], counts[order]
    failed = np.ones(cand.size, dtype=np.bool_)  # with no useful target, every candidate fails
    if cols.size:
        targets = free_mem[cols], free_cpu[cols], cpus[cols]
        rows_per_block = max(1, _BLOCK_CELLS // cols.size)
        for b in range(0, cand.size, rows_per_block):
            block = slice(b, b + rows_per_block)
            own = col_of[cand[block]]
            failed[block] = _first_fit_block(own, starts[block], counts[block], table, *targets)
    failing = sorted(up[i].report.host_id for i in cand[failed].tolist())
    return HaResult(failing, n, int(table.host.size))


def failing_hosts(
    hosts: Sequence[HostState],
    vms: Sequence[VmReport],
    pending: Iterable[PendingEntry] = (),
    *,
    count_threads_as_cores: bool = False,
) -> list[str]:
    """Failing host ids, sorted: the fast version of naive_failing_hosts."""
    return check(hosts, vms, pending, count_threads_as_cores=count_threads_as_cores).failing_hosts


def _useful_targets(
    free_mem: FloatArray, free_cpu: FloatArray, cpus: FloatArray, table: _HaVmTable
) -> npt.NDArray[np.intp]:
    """Indexes, in host order, of the hosts that could take at least the smallest HA VM.

    A host short of the least memory or the least CPU share any HA VM needs takes no VM in any
    row (free resources only shrink, and c / cpus grows with c), so first fit never picks it:
    dropping its column changes no placement and saves work in every step."""
    takes = cpus > 0
    safe_cpus = np.where(takes, cpus, 1.0)  # no division by zero; such hosts are dropped anyway
    useful = takes & (free_mem >= table.need_mem.min()) & (free_cpu >= table.need_cpu.min() / safe_cpus)
    return np.flatnonzero(useful)


def _first_fit_block(
    own: npt.NDArray[np.intp],
    starts: npt.NDArray[np.intp],
    counts: npt.NDArray[np.intp],
    table: _HaVmTable,
    free_mem: FloatArray,
    free_cpu: FloatArray,
    cpus: FloatArray,
) -> npt.NDArray[np.bool_]:
    """First fit of each row's HA VMs over the target columns; True where a VM found no host.

    Row i holds table rows starts[i] : starts[i] + counts[i]; own[i] is its host's column (or -1);
    rows are ordered by count, descending. Ranks are placed for all rows at once while many rows
    are still placing; the few long rows left then finish one at a time."""
    r = own.size
    fm = np.tile(free_mem, (r, 1))
    fc = np.tile(free_cpu, (r, 1))
    mine = np.flatnonzero(own >= 0)
    fm[mine, own[mine]] = -np.inf
    failed = np.zeros(r, dtype=np.bool_)
    # Rows still placing at rank k: counts is descending, so a prefix.
    active_until = np.searchsorted(-counts, -np.arange(1, int(counts[0]) + 1), side="right")
    k = 0
    while k < active_until.size and active_until[k] > _ROW_AT_A_TIME:
        a = int(active_until[k])
        idx = starts[:a] + k
        failed[:a] |= ~_place_rank(fm[:a], fc[:a], table.need_mem[idx], table.need_cpu[idx], cpus, failed[:a])
        k += 1
    if k < active_until.size:
        for i in range(int(active_until[k])):
            if not failed[i]:
                vms = slice(int(starts[i]) + k, int(starts[i] + counts[i]))
                failed[i] = not _first_fit_row(fm[i], fc[i], table.need_mem[vms], table.need_cpu[vms], cpus)
    return failed


def _place_rank(
    fm: FloatArray, fc: FloatArray, m: FloatArray, c: FloatArray, cpus: FloatArray, settled: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Place one VM per row (need m[i], c[i]) on the row's first fitting column; False where none fits.

    First fit mostly lands among the first columns, so those are tried first for every row and only
    the rows with no fit there look at the rest: the first fit in a prefix is the first fit overall.
    Rows already failed (`settled`) skip the wider look: their answer cannot change."""
    w = min(_FIRST_COLUMNS, fm.shape[1])
    fit = (fm[:, :w] >= m[:, None]) & (fc[:, :w] >= c[:, None] / cpus[:w])
    first = fit.argmax(axis=1)
    ok: npt.NDArray[np.bool_] = fit[np.arange(fit.shape[0]), first]
    miss = np.flatnonzero(~ok & ~settled)
    if miss.size and w < fm.shape[1]:
        rest = (fm[miss, w:] >= m[miss, None]) & (fc[miss, w:] >= c[miss, None] / cpus[w:])
        first_rest = rest.argmax(axis=1)
        first[miss] = first_rest + w
        ok[miss] = rest[np.arange(miss.size), first_rest]
    placed = np.flatnonzero(ok)
    ys = first[placed]
    fm[placed, ys] -= m[placed]
    fc[placed, ys] -= c[placed] / cpus[ys]
    return ok


def _first_fit_row(
    fm: FloatArray, fc: FloatArray, need_mem: FloatArray, need_cpu: FloatArray, cpus: FloatArray
) -> bool:
    """First fit of one row's VMs, in order, onto its free resources (updated in place); False if one finds no host.

    A host with thousands of HA VMs would cost one round of array calls per VM. Instead the fits of a
    chunk of VMs are computed against the free resources at the chunk's start, and the chunk is then
    walked in Python: a column's free resources only shrink, so a VM's first fit now is at or after
    its first fit then; a column nothing in the chunk touched still fits as it did, and a touched one
    is checked against its current free resources (kept in `touched`)."""
    cpus_list: list[float] = cpus.tolist()
    for start in range(0, need_mem.size, _CHUNK):
        m = need_mem[start : start + _CHUNK]
        c = need_cpu[start : start + _CHUNK]
        fit = (fm >= m[:, None]) & (fc >= c[:, None] / cpus)
        firsts: list[int] = fit.argmax(axis=1).tolist()
        touched: dict[int, list[float]] = {}
        for j, (mem, cpu) in enumerate(zip(m.tolist(), c.tolist(), strict=True)):
            y = firsts[j]
            while True:
                if not fit[j, y]:
                    return False  # nothing fitted at the chunk's start: nothing fits now
                free = touched.get(y)
                if free is None:
                    free = touched[y] = [float(fm[y]), float(fc[y])]
                    break
                if free[0] >= mem and free[1] >= cpu / cpus_list[y]:
                    break
                if y + 1 == fm.size:
                    return False
                y += 1 + int(fit[j, y + 1 :].argmax())
            free[0] -= mem
            free[1] -= cpu / cpus_list[y]
        for y, (mem_left, cpu_left) in touched.items():
            fm[y] = mem_left
            fc[y] = cpu_left
    return True


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
