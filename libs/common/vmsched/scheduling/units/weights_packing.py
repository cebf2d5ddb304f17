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

The unit's balance is `packing_balance` (balance_packing).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import FloatArray, HostTable
from vmsched.scheduling.units.balance_packing import packing_balance
from vmsched.scheduling.units.base import PolicyUnit, Props, prop_int
from vmsched.scheduling.units.helpers import (
    VCPU_CONSUMPTION_PCT,
    current_host_position,
    except_current_host,
    max_scheduling_memory_mb,
    vm_memory_need_mb,
)
from vmsched.scheduling.units.weights import POWER_SAVING_PROPERTIES, WORST_WEIGHT, cpu_loads

#: Where each kind of host starts on the weight's scale (see the module doc).
EMPTY_BASE: Final = 3.0
OVER_BASE: Final = 5.0
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
    known, cpus, host_load = cpu_loads(hosts)
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

__all__ = ["PACKING", "PACKING_MAXIMUM", "PACKING_UNITS", "packing_vm_load", "packing_weight"]
