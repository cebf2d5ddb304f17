"""Vector bin-packing weight and balance units (vmsched's own, not oVirt's): the `tight_packing`
policy's.

oVirt's power saving weighs CPU and memory apart (the busiest CPU, the least free memory) and
ranks each, so a small host half full and a large one half full look alike, a VM whose shape
(CPU against memory) leaves one resource stranded is placed as readily as one that complements
the host, and an empty small host is opened as readily as an empty large one. Packing that stays
near the first-fit-decreasing bound needs all three, so OptimalForPacking scores a host by the
vector of what it has left after the VM, as the norm-based greedy heuristics of the vector
bin-packing literature do (Panigrahy et al., "Heuristics for Vector Bin Packing", 2011):

* a host already in use where the VM fits within the headroom (CPU load after it <= HighUtilization,
  memory after it >= 0): rc^2 + rm^2 in [0, 2], where rc and rm are the CPU headroom and the
  scheduling memory the host has left after the VM, as fractions of the host's own. Smallest is
  best: the fullest host that still fits (best fit), and of two equally full, the one the VM's
  shape complements (|r - d|^2 = |r|^2 - 2 r.d + |d|^2: a large dot product of what is left and
  what the VM takes, "tetris" alignment, lowers it);
* an empty host (no VM running or pending): 3 + (1 - size / largest size) in [3, 4], the largest
  first, so a host is opened only when no used host fits and then the largest;
* a host where the VM does not fit within the headroom: 5 + how far over, up to 8 (empty hosts 2
  further), so it is only taken when nothing else is left;
* a host with unknown CPU topology: WORST_WEIGHT.

The VM's CPU load is the one it declares (cpu_usage_pct) when it has one, a running VM's measured
load on a migration, oVirt's VcpuConsumptionPercentage per vCPU otherwise.

The balance (`packing_balance`) is power saving's migrations (relieve hosts over HighUtilization,
evacuate hosts under LowUtilization onto busier ones) with size-aware power advice: the smallest
empty host is powered off first, the largest host that is not Up powered on first, so the hosts
kept on are the ones the weight would open.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np

from vmsched.contracts import VmReport, VmSpec
from vmsched.scheduling.hosts import FloatArray, HostTable
from vmsched.scheduling.properties import HOSTS_IN_RESERVE_PROPERTY, POWER_MANAGEMENT_PROPERTY
from vmsched.scheduling.units.balance_load import destination_mask, effective_load, order_by
from vmsched.scheduling.units.balance_power import POWER_OFF, POWER_ON, power_saving_balance
from vmsched.scheduling.units.balance_search import Fit, MovableVms, find_migration
from vmsched.scheduling.units.base import BalanceOutcome, Migration, PolicyUnit, PowerChange, Props, prop_bool, prop_int
from vmsched.scheduling.units.helpers import (
    VCPU_CONSUMPTION_PCT,
    current_host_position,
    except_current_host,
    fmt_num,
    max_scheduling_memory_mb,
    vm_memory_need_mb,
)
from vmsched.scheduling.units.weights import (
    POWER_SAVING_PROPERTIES,
    WORST_WEIGHT,
    _cpu_loads,
)

#: Where each kind of host starts on the weight's scale (see the module doc).
EMPTY_BASE: Final = 3.0
OVER_BASE: Final = 5.0
#: CPU points under HighUtilization a consolidation leaves on the hosts it fills.
CONSOLIDATION_MARGIN: Final = 5.0
#: The highest weight a host with known topology gets (an empty host over the headroom).
PACKING_MAXIMUM: Final = OVER_BASE + 3.0


def packing_vm_load(vm: VmSpec) -> float:
    """The CPU load the VM brings, in % of one CPU: measured when it runs, declared when it says,
    VcpuConsumptionPercentage per vCPU otherwise."""
    declared = vm.current_host is not None or vm.cpu_usage_pct > 0
    per_vcpu = vm.cpu_usage_pct if declared else VCPU_CONSUMPTION_PCT
    return per_vcpu * vm.vcpus


def packing_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """See the module doc: lower is better; used hosts that fit < empty hosts < hosts over headroom."""
    n = len(hosts)
    if n == 0:
        return np.zeros(0)
    known, cpus, host_load = _cpu_loads(hosts)
    high = float(prop_int(props, "HighUtilization", 80))
    cpu_cap = high * cpus
    cpu_after = host_load + except_current_host(hosts, vm, packing_vm_load(vm))
    sched = max_scheduling_memory_mb(hosts)
    # The host's scheduling capacity: what it has free plus what VMs hold or are about to.
    mem_cap = np.maximum(sched + hosts.mem_committed_mb + hosts.pending_mem_mb, 1.0)
    mem_after = sched - except_current_host(hosts, vm, vm_memory_need_mb(vm))
    fits = (cpu_after <= cpu_cap) & (mem_after >= 0.0)
    used = (hosts.vm_count + hosts.pending_vm_count) > 0
    pos = current_host_position(hosts, vm)
    if pos is not None:  # the VM's own host is in use, whatever its counters say
        used = used.copy()
        used[pos] = True
    rc = np.clip((cpu_cap - cpu_after) / cpu_cap, 0.0, 1.0)
    rm = np.clip(mem_after / mem_cap, 0.0, 1.0)
    size = cpu_cap / float(cpu_cap.max()) + mem_cap / float(mem_cap.max())
    empty = EMPTY_BASE + (1.0 - size / float(size.max()))
    over = np.clip((cpu_after - cpu_cap) / cpu_cap, 0.0, 1.0) + np.clip(-mem_after / mem_cap, 0.0, 1.0)
    score = np.where(fits, np.where(used, rc * rc + rm * rm, empty), OVER_BASE + over + np.where(used, 0.0, 1.0))
    return score if known.all() else np.where(known, score, WORST_WEIGHT)


def packing_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """Power saving's migration, else a consolidation; power advice by host size (see the module doc)."""
    migration = power_saving_balance(hosts, vms, props).migration
    if migration is None:
        migration = _consolidation(hosts, vms, props)
    return BalanceOutcome(migration, _power_advice_by_size(hosts, props, migration))


def _consolidation(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> Migration | None:
    """Empty the host in use that holds least (CPU and memory, as shares of the largest host's)
    when the other hosts in use have room for all it holds within HighUtilization less
    CONSOLIDATION_MARGIN: one of its VMs to one of them. Power saving evacuates a host only below
    LowUtilization, so when the load curve falls in the evening hosts stay half full; this frees
    the one a first-fit-decreasing packing would not need. The margin keeps a host just filled
    from going over HighUtilization (and being relieved) at the next rise of the load."""
    cpus = hosts.effective_cpus
    used = destination_mask(hosts) & ((hosts.vm_count + hosts.pending_vm_count) > 0) & (cpus > 0)
    if int(np.count_nonzero(used)) < 2:
        return None
    target = float(prop_int(props, "HighUtilization", 80)) - CONSOLIDATION_MARGIN
    load = effective_load(hosts)
    sched = np.maximum(max_scheduling_memory_mb(hosts), 0.0)
    cpu_use = load * cpus
    mem_use = hosts.mem_committed_mb + hosts.pending_mem_mb
    held = cpu_use / max(float(cpu_use.max()), 1e-9) + mem_use / max(float(mem_use.max()), 1e-9)
    s = order_by(used, held, descending=False)[0]
    others = used.copy()
    others[s] = False
    cpu_room = float((np.maximum(target - load, 0.0) * cpus)[others].sum())
    if cpu_room < cpu_use[s] or float(sched[others].sum()) < mem_use[s]:
        return None

    def reason(i: int) -> str:
        return (
            f"host {hosts.ids[i]} (CPU {fmt_num(round(float(load[i]), 1))}%, {fmt_num(round(float(mem_use[i])))} MB)"
            f" fits on the other {int(np.count_nonzero(others))} hosts in use within {fmt_num(target)}%: emptying it"
        )

    return find_migration(hosts, MovableVms(vms), [s], others, Fit(hosts, target, 0.0, load), reason)


def _power_advice_by_size(hosts: HostTable, props: Props, migration: Migration | None) -> tuple[PowerChange, ...]:
    """power_saving's advice (at most one change; HostsInReserve empty Up hosts kept), taking the
    smallest empty host off first and the largest host that is not Up on first (table order among
    equals)."""
    if not prop_bool(props, POWER_MANAGEMENT_PROPERTY, False):
        return ()
    reserve = prop_int(props, HOSTS_IN_RESERVE_PROPERTY, 0)
    empty_mask = hosts.up & (hosts.vm_count == 0) & (hosts.pending_vm_count == 0)
    empty_mask &= np.fromiter((not ids for ids in hosts.vm_ids), dtype=np.bool_, count=len(hosts))
    empty = np.flatnonzero(empty_mask)
    size = hosts.effective_cpus + hosts.physical_mem_mb / 1024.0
    if len(empty) > reserve:
        only = migration.candidates[0] if migration is not None and len(migration.candidates) == 1 else None
        for i in (int(j) for j in empty[np.argsort(size[empty], kind="stable")]):
            if not hosts.is_spm[i] and hosts.ids[i] != only:
                why = (
                    f"{len(empty)} empty Up hosts > HostsInReserve {reserve}: host {hosts.ids[i]} runs no VM"
                    " (the smallest empty host)"
                )
                return (PowerChange(hosts.ids[i], POWER_OFF, why),)
        return ()
    if len(empty) < reserve:
        down = np.flatnonzero(~hosts.up)
        if len(down):
            i = int(down[np.argsort(-size[down], kind="stable")][0])
            why = (
                f"{len(empty)} empty Up hosts < HostsInReserve {reserve}: host {hosts.ids[i]} is not Up"
                " (the largest such host)"
            )
            return (PowerChange(hosts.ids[i], POWER_ON, why),)
    return ()


PACKING = PolicyUnit(
    name="OptimalForPacking",
    description=(
        "Packs VMs by CPU and memory together: the fullest used host the VM fits within HighUtilization,"
        " the one whose leftover the VM's shape complements; an empty host only when no used host fits,"
        " the largest first."
    ),
    summary="vector packing",
    weight=packing_weight,
    balance=packing_balance,
    # All but HighUtilization are read by the balance (power saving's, with power advice by size).
    properties=POWER_SAVING_PROPERTIES,
    minimum=0.0,
    maximum=PACKING_MAXIMUM,
)

PACKING_UNITS: tuple[PolicyUnit, ...] = (PACKING,)

__all__ = ["PACKING", "PACKING_MAXIMUM", "PACKING_UNITS", "packing_balance", "packing_vm_load", "packing_weight"]
