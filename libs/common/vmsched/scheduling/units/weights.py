"""oVirt weight units (soft constraints, "cost functions"): lower raw weight is better.

Formulas follow oVirt's engine (EvenDistributionCPUWeightPolicyUnit, PowerSavingCPUWeightPolicyUnit,
EvenDistributionMemoryWeightPolicyUnit, EvenGuestDistributionWeightPolicyUnit,
PowerSavingMemoryWeightPolicyUnit, HaReservationWeightPolicyUnit, PreferredHostsWeightPolicyUnit). One deliberate
difference for the CPU units: oVirt finally "stretches" the CPU scores onto [1, MaxSchedulerWeight];
vmsched reports the projected load per CPU itself, which is what an operator wants to read in a
score table. The stretch is monotone, so the RankSelector orders hosts the same, except that after a
x1000 vCPU-ratio penalty oVirt's stretch rounds distinct unpenalized loads together; vmsched keeps
them apart. Units whose weights feed other selectors (dynamic maximum, min-max) normalize there.

Engine-wide oVirt config values the units read (not policy properties) are module constants.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from vmsched.contracts import VmSpec
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, all_true, constant
from vmsched.scheduling.properties import (
    HA_RESERVATION_PROPERTY,
    HIGH_VM_COUNT_PROPERTY,
    HOSTS_IN_RESERVE_PROPERTY,
    MIGRATION_THRESHOLD_PROPERTY,
    POWER_MANAGEMENT_PROPERTY,
)
from vmsched.scheduling.units.balance import (
    even_distribution_balance,
    even_vm_count_balance,
    ha_reservation_balance,
    power_saving_balance,
)
from vmsched.scheduling.units.base import PolicyUnit, PropertySpec, Props, prop_bool, prop_float, prop_int
from vmsched.scheduling.units.helpers import (
    CPU_OVERCOMMIT_DURATION,
    HIGH_UTILIZATION,
    SPM_VCPU_CONSUMPTION,
    VCPU_CONSUMPTION_PCT,
    except_current_host,
    known_cpus,
    max_scheduling_memory_mb,
    spm_vcpus,
    vm_memory_need_mb,
)

# VCPU_CONSUMPTION_PCT and SPM_VCPU_CONSUMPTION (oVirt engine config) and the HighUtilization /
# CpuOverCommitDurationMinutes properties live in units/helpers.py, shared with CPUOverloaded.
#: oVirt MaxSchedulerWeight: the scale of the memory weight.
MAX_SCHEDULER_WEIGHT: Final = 1000.0
#: oVirt multiplies the CPU weight by this when placing the VM would exceed VCpuToPhysicalCpuRatio.
VCPU_RATIO_PENALTY: Final = 1000.0
#: The weight of a host a unit cannot judge (unknown CPU topology) or rules out (over HighUtilization
#: in power saving). Finite so score tables stay JSON; far above any real weight (a penalized load of
#: 100 000 % per CPU is still only 1e8).
WORST_WEIGHT: Final = 1e9

#: oVirt PreferredHostsWeightPolicyUnit's penalty for a host that is not preferred (hard-coded
#: there, "TODO externalize weight").
NOT_PREFERRED_WEIGHT: Final = 10000.0
#: oVirt HaReservationWeightPolicyUnit RATIO_FACTOR: HA VM counts are fitted onto 0..100.
HA_RATIO_FACTOR: Final = 100.0

# ------------------------------------------------------------------------- custom properties
LOW_UTILIZATION = PropertySpec(
    r"^([0-9]|[1-4][0-9])$", "20", "CPU load (%) below which a host counts as under-utilized"
)
VCPU_TO_PHYSICAL_CPU_RATIO = PropertySpec(
    r"^([0-2](\.([0-9]+))?)$", "0", "max vCPUs per host CPU before a x1000 weight penalty; 0 = off"
)
HIGH_VM_COUNT = PropertySpec(r"^([0-9]|[1-9][0-9]+)$", "10", "VM slots above which a host counts as over-loaded")
MIGRATION_THRESHOLD = PropertySpec(
    r"^([2-9]|[1-9][0-9]+)$", "5", "VM-slot difference between hosts that triggers a migration"
)
SPM_VM_GRACE = PropertySpec(r"^([0-9]|[1-9][0-9]+)$", "5", "VM slots the SPM role occupies on its host")
MAX_FREE_MEMORY_FOR_OVER_UTILIZED = PropertySpec(
    r"^([1-9][0-9]*)$", None, "free scheduling memory (MB) below which a host counts as over-utilized"
)
MIN_FREE_MEMORY_FOR_UNDER_UTILIZED = PropertySpec(
    r"^([1-9][0-9]*)$", None, "free scheduling memory (MB) above which a host counts as under-utilized"
)
SCALE_DOWN = PropertySpec(r"(100|[1-9]|[1-9][0-9])$", "1", "divides the HA reservation weight (0..100)")
HOSTS_IN_RESERVE = PropertySpec(r"^[0-9][0-9]*$", "0", "empty Up hosts power saving keeps powered on")
ENABLE_AUTOMATIC_HOST_POWER_MANAGEMENT = PropertySpec(
    r"^(true|false)$", "false", "power saving advises powering empty hosts off and spare hosts on"
)
OVER_UTILIZATION = PropertySpec(
    r"([1-3][0-9][0-9])$", "200", "HA VMs on a host (% of the optimal spread) above which one is migrated"
)


def java_round(x: FloatArray) -> FloatArray:
    """Java's Math.round (half up, also for negatives), which oVirt's integer weights use."""
    return np.floor(x + 0.5)


def _prop_default(spec: PropertySpec) -> str:
    assert spec.default is not None
    return spec.default


# ------------------------------------------------------------------------- CPU load model
def host_cpu_load(hosts: HostTable, cpus: FloatArray) -> FloatArray:
    """oVirt calcHostLoad: the host's load in % of one CPU (4 busy CPUs = 400), pending and SPM included."""
    return hosts.cpu_usage_pct * cpus + VCPU_CONSUMPTION_PCT * (hosts.pending_vcpus + spm_vcpus(hosts))


def cpu_loads(hosts: HostTable) -> tuple[BoolArray, FloatArray, FloatArray]:
    """Which hosts have a known topology, their CPU count (1 where unknown) and their load
    (calcHostLoad over that count): made once per version of the whole table, a sub-table takes
    its rows' (three columns taken instead of the five they are made of)."""
    known, cpus = known_cpus(hosts)
    columns = ("cpu_usage_pct", "cpu_threads", "cpu_cores", "pending_vcpus", "is_spm")
    return known, cpus, hosts.derived("host_cpu_load", columns, _host_cpu_load)


def _host_cpu_load(hosts: HostTable) -> FloatArray:
    return host_cpu_load(hosts, known_cpus(hosts)[1])


def vm_cpu_load(vm: VmSpec) -> float:
    """The load the VM brings, in % of one CPU: its measured load when it runs (a migration),
    VcpuConsumptionPercentage per vCPU otherwise (oVirt)."""
    per_vcpu = vm.cpu_usage_pct if vm.current_host is not None else VCPU_CONSUMPTION_PCT
    return per_vcpu * vm.vcpus


def projected_load_per_cpu(hosts: HostTable, vm: VmSpec, cpus: FloatArray, host_load: FloatArray) -> FloatArray:
    """Load per CPU (%) after placing the VM; nothing is added on the host the VM already runs on."""
    added = except_current_host(hosts, vm, vm_cpu_load(vm))
    return (host_load + added) / cpus


def vcpu_ratio_penalty(hosts: HostTable, vm: VmSpec, cpus: FloatArray, ratio_limit: float) -> FloatArray:
    """x1000 where (committed + pending + the VM's vCPUs) / host CPUs would reach the limit; 1 elsewhere.

    oVirt's test is `ratio < limit ? 1 : 1000`, so reaching the limit exactly is already penalized.
    """
    if ratio_limit == 0:
        return np.ones(len(hosts))
    added = except_current_host(hosts, vm, float(vm.vcpus))
    ratio = (hosts.vcpus_committed + hosts.pending_vcpus + added) / cpus
    return np.where(ratio < ratio_limit, 1.0, VCPU_RATIO_PENALTY)


# ------------------------------------------------------------------------- weight functions
def even_cpu_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """Projected load per CPU in whole % (Java rounding), x1000 over VCpuToPhysicalCpuRatio;
    WORST_WEIGHT for a host with unknown topology."""
    known, cpus, host_load = cpu_loads(hosts)
    ratio_limit = prop_float(props, "VCpuToPhysicalCpuRatio", 0.0)
    load = projected_load_per_cpu(hosts, vm, cpus, host_load)
    if ratio_limit != 0:  # without a limit the penalty is 1 everywhere
        load = vcpu_ratio_penalty(hosts, vm, cpus, ratio_limit) * load
    score = java_round(load)
    return score if all_true(known) else np.where(known, score, WORST_WEIGHT)


def power_saving_cpu_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """The negated projected load per CPU (busiest host best); WORST_WEIGHT for a host already over
    HighUtilization before the VM is placed, or with unknown topology. All such hosts tie, as in
    oVirt, so the policy's other units decide among them."""
    known, cpus, host_load = cpu_loads(hosts)
    high = prop_int(props, "HighUtilization", int(_prop_default(HIGH_UTILIZATION)))
    judged = known & ~(host_load > high * cpus)
    # 0 - x, not -x: -0.0 would print oddly in a score table.
    score = 0.0 - java_round(projected_load_per_cpu(hosts, vm, cpus, host_load))
    return score if all_true(judged) else np.where(judged, score, WORST_WEIGHT)


def even_memory_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """oVirt's scale: 1000 - round((sched - 1) x 999 / (max_sched - 1)), where sched is the host's max
    scheduling memory (pending included, clamped at 0) minus the VM's need, and max_sched the largest
    max scheduling memory among the hosts weighed. ~1 for the roomiest host, 1000 for a full one;
    decreasing in free memory after placing the VM. Nothing is subtracted on the VM's current host.
    """
    if len(hosts) == 0:
        return np.zeros(0)
    max_sched = np.maximum(max_scheduling_memory_mb(hosts), 0.0)
    need = except_current_host(hosts, vm, vm_memory_need_mb(vm))
    after = max_sched - need
    # oVirt divides by (max - 1) unguarded; when no host has more than 1 MB left keep the formula
    # decreasing instead of dividing by zero or flipping its sign.
    denom = max(float(max_sched.max()) - 1.0, 1.0)
    score = java_round((after - 1.0) * (MAX_SCHEDULER_WEIGHT - 1.0) / denom)
    return MAX_SCHEDULER_WEIGHT - score


def even_guest_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """Occupied VM slots: running VMs + SpmVmGrace on the SPM host + pending VMs (never below 0)."""
    grace = prop_int(props, "SpmVmGrace", int(_prop_default(SPM_VM_GRACE)))
    slots = hosts.vm_count + np.where(hosts.is_spm, float(grace), 0.0) + hosts.pending_vm_count
    return np.maximum(slots, 0.0)


def power_saving_memory_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """oVirt's scale, increasing in free memory (the fullest host that still fits is best):
    int(mem / max_mem x 999) + 1 in [1, 1000], where mem is the host's max scheduling memory
    (pending included, clamped at 0) minus the VM's need (nothing on its current host), and max_mem
    1.1 x the largest max scheduling memory among the hosts weighed.

    A host left with less than MaxFreeMemoryForOverUtilized (default 0) is "wrapped" as if it had
    min(max_mem, MinFreeMemoryForUnderUtilized + the shortfall) free (default limit: none), so
    over-utilized hosts, and hosts the VM does not fit, rank after every host that fits. When no
    host has any scheduling memory every host gets 1000 (oVirt divides by zero there).
    """
    n = len(hosts)
    if n == 0:
        return np.zeros(0)
    low = prop_float(props, "MaxFreeMemoryForOverUtilized", 0.0)
    high = prop_float(props, "MinFreeMemoryForUnderUtilized", np.inf)
    sched = np.maximum(max_scheduling_memory_mb(hosts), 0.0)
    max_mem = float(sched.max()) * 1.1
    if max_mem <= 0:
        return np.full(n, MAX_SCHEDULER_WEIGHT)
    need = except_current_host(hosts, vm, vm_memory_need_mb(vm))
    mem = sched - need
    wrapped = mem < low
    if wrapped.any():
        mem = np.where(wrapped, np.minimum(max_mem, high + (low - mem)), mem)
    return np.trunc(mem / max_mem * (MAX_SCHEDULER_WEIGHT - 1.0)) + 1.0


#: Not set by administrators: vmsched sets it from the cluster's HA reservation switch in PostgreSQL
#: (cluster_policy.ha_reservation), so the weight, the balance and the HA monitor obey one switch.
HA_RESERVATION_ON = PropertySpec(
    r"^(true|false)$", "false", "HA reservation is on for the cluster (from cluster_policy.ha_reservation)"
)


def ha_reservation_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """For an HA VM in a cluster with HA reservation: the host's HA VM count fitted onto 0..100 of
    the largest count among the hosts weighed (Java rounding), divided by ScaleDown and rounded up,
    so HA VMs spread over hosts. 0 everywhere for other VMs or clusters, and when no host runs one.

    oVirt counts the HA VMs running on each host; pending HA VMs are not told apart from other
    pending VMs in vmsched's pending records, so they are not counted (as in oVirt).
    """
    n = len(hosts)
    if n == 0 or not vm.ha or not prop_bool(props, HA_RESERVATION_PROPERTY, False):
        return constant(n, 0.0)
    scale_down = float(prop_int(props, "ScaleDown", int(_prop_default(SCALE_DOWN))))
    counts = np.maximum(hosts.ha_vm_count, 0.0)
    most = float(counts.max())
    fitted = java_round(counts / most * HA_RATIO_FACTOR) if most > 0 else counts
    return np.ceil(fitted / scale_down)


def preferred_hosts_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """0 on the VM's preferred hosts, oVirt's 10000 on every other host; 0 everywhere when the VM
    prefers none. As in oVirt, preferences apply only when the VM starts: on a migration (the VM
    has a current host) every host gets 0."""
    n = len(hosts)
    if not vm.preferred_hosts or vm.current_host is not None:
        return constant(n, 0.0)
    is_preferred = hosts.mask_of(vm.preferred_hosts)
    return np.where(is_preferred, 0.0, NOT_PREFERRED_WEIGHT)


# ------------------------------------------------------------------------- units
EVEN_CPU = PolicyUnit(
    name="OptimalForEvenCpuDistribution",
    description="Prefers hosts with the lowest CPU load per CPU after placing the VM.",
    summary="CPU load",
    weight=even_cpu_weight,
    balance=even_distribution_balance,
    # HighUtilization, CpuOverCommitDurationMinutes and the memory limits are read by the balance.
    properties={
        "HighUtilization": HIGH_UTILIZATION,
        "CpuOverCommitDurationMinutes": CPU_OVERCOMMIT_DURATION,
        "VCpuToPhysicalCpuRatio": VCPU_TO_PHYSICAL_CPU_RATIO,
        "MaxFreeMemoryForOverUtilized": MAX_FREE_MEMORY_FOR_OVER_UTILIZED,
        "MinFreeMemoryForUnderUtilized": MIN_FREE_MEMORY_FOR_UNDER_UTILIZED,
    },
)
EVEN_MEMORY = PolicyUnit(
    name="OptimalForEvenMemoryDistribution",
    description="Prefers hosts with the most free scheduling memory after placing the VM.",
    summary="free memory",
    weight=even_memory_weight,
)
#: What power saving's balance reads besides HighUtilization (the units that balance as it does
#: declare these too: OptimalForCpuPowerSaving, OptimalForPacking).
POWER_SAVING_PROPERTIES: Final = {
    "HighUtilization": HIGH_UTILIZATION,
    "LowUtilization": LOW_UTILIZATION,
    "CpuOverCommitDurationMinutes": CPU_OVERCOMMIT_DURATION,
    "MaxFreeMemoryForOverUtilized": MAX_FREE_MEMORY_FOR_OVER_UTILIZED,
    "MinFreeMemoryForUnderUtilized": MIN_FREE_MEMORY_FOR_UNDER_UTILIZED,
    HOSTS_IN_RESERVE_PROPERTY: HOSTS_IN_RESERVE,
    POWER_MANAGEMENT_PROPERTY: ENABLE_AUTOMATIC_HOST_POWER_MANAGEMENT,
}
POWER_SAVING_CPU = PolicyUnit(
    name="OptimalForCpuPowerSaving",
    description="Prefers the busiest host that is not over HighUtilization, to pack VMs onto few hosts.",
    summary="CPU packing",
    weight=power_saving_cpu_weight,
    balance=power_saving_balance,
    # All but HighUtilization are read by the power-saving balance only.
    properties=POWER_SAVING_PROPERTIES,
)
EVEN_GUEST = PolicyUnit(
    name="OptimalForEvenGuestDistribution",
    description="Prefers hosts running the fewest VMs (the SPM host counts SpmVmGrace extra).",
    summary="VM count",
    weight=even_guest_weight,
    balance=even_vm_count_balance,
    # HighVmCount and MigrationThreshold are read by the even-VM-count balance.
    properties={
        HIGH_VM_COUNT_PROPERTY: HIGH_VM_COUNT,
        MIGRATION_THRESHOLD_PROPERTY: MIGRATION_THRESHOLD,
        "SpmVmGrace": SPM_VM_GRACE,
    },
)

POWER_SAVING_MEMORY = PolicyUnit(
    name="OptimalForMemoryPowerSaving",
    description="Prefers the host with the least free scheduling memory that still fits the VM, to pack VMs.",
    summary="memory packing",
    weight=power_saving_memory_weight,
    properties={
        "MaxFreeMemoryForOverUtilized": MAX_FREE_MEMORY_FOR_OVER_UTILIZED,
        "MinFreeMemoryForUnderUtilized": MIN_FREE_MEMORY_FOR_UNDER_UTILIZED,
    },
    minimum=1.0,
    maximum=MAX_SCHEDULER_WEIGHT,
)
HA_RESERVATION = PolicyUnit(
    name="OptimalForHaReservation",
    description="Spreads HA VMs of HA-reservation clusters: prefers hosts running fewer HA VMs.",
    summary="HA VM count",
    weight=ha_reservation_weight,
    balance=ha_reservation_balance,
    properties={
        "ScaleDown": SCALE_DOWN,
        "OverUtilization": OVER_UTILIZATION,
        HA_RESERVATION_PROPERTY: HA_RESERVATION_ON,
    },
    minimum=0.0,
    maximum=HA_RATIO_FACTOR,
)
PREFERRED_HOSTS = PolicyUnit(
    name="PreferredHosts",
    description="Prefers the VM's preferred hosts when it starts.",
    summary="not a preferred host",
    weight=preferred_hosts_weight,
    minimum=0.0,
    maximum=NOT_PREFERRED_WEIGHT,
)

WEIGHT_UNITS: tuple[PolicyUnit, ...] = (
    EVEN_CPU,
    EVEN_MEMORY,
    POWER_SAVING_CPU,
    EVEN_GUEST,
    POWER_SAVING_MEMORY,
    HA_RESERVATION,
    PREFERRED_HOSTS,
)

__all__ = [
    "EVEN_CPU",
    "EVEN_GUEST",
    "EVEN_MEMORY",
    "HA_RATIO_FACTOR",
    "HA_RESERVATION",
    "MAX_SCHEDULER_WEIGHT",
    "NOT_PREFERRED_WEIGHT",
    "POWER_SAVING_CPU",
    "POWER_SAVING_MEMORY",
    "PREFERRED_HOSTS",
    "SPM_VCPU_CONSUMPTION",
    "VCPU_CONSUMPTION_PCT",
    "VCPU_RATIO_PENALTY",
    "WEIGHT_UNITS",
    "WORST_WEIGHT",
    "cpu_loads",
    "even_cpu_weight",
    "even_guest_weight",
    "even_memory_weight",
    "ha_reservation_weight",
    "host_cpu_load",
    "java_round",
    "power_saving_cpu_weight",
    "power_saving_memory_weight",
    "preferred_hosts_weight",
    "projected_load_per_cpu",
    "vcpu_ratio_penalty",
    "vm_cpu_load",
]
