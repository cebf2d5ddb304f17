"""oVirt filter units (hard constraints): the catalogue `FILTER_UNITS`, in catalogue order.

The units live by what they check: memory_filters (Memory, Swap, HugePages), cpu_filters (CPU,
CPUOverloaded, CPUTopology) and rule_filters (Network, PinToHost, Migration, Emulated-Machine,
CPU-Level, ClusterInMaintenance, MigrationDomain). The formulas follow oVirt's engine; where vmsched
deliberately differs from the engine's code, the difference and its reason are noted at the unit.
Every name is importable from here too (the registry, the tests and older plugins import them so).
"""

from __future__ import annotations

from vmsched.scheduling.units.base import PolicyUnit
from vmsched.scheduling.units.cpu_filters import (
    CPU,
    CPU_OVERLOADED,
    CPU_TOPOLOGY,
    cpu_filter,
    cpu_overloaded_filter,
    cpu_topology_filter,
)
from vmsched.scheduling.units.helpers import (
    CPU_OVERCOMMIT_DURATION,
    HIGH_UTILIZATION,
    SPM_VCPU_CONSUMPTION,
    VCPU_CONSUMPTION_PCT,
    current_host_mask,
    fmt_num,
    max_scheduling_memory_mb,
    spm_load_share,
    vm_memory_need_mb,
)
from vmsched.scheduling.units.memory_filters import (
    HUGEPAGES,
    MAX_ALLOWED_SWAP_USAGE,
    MEMORY,
    SWAP,
    hugepages_filter,
    hugepages_needed,
    memory_filter,
    swap_filter,
)
from vmsched.scheduling.units.rule_filters import (
    CLUSTER_IN_MAINTENANCE,
    CPU_LEVEL,
    EMULATED_MACHINE,
    MAX_NAMES_IN_REASON,
    MIGRATION,
    MIGRATION_DOMAIN,
    NETWORK,
    PIN_TO_HOST,
    cluster_in_maintenance_filter,
    cpu_level_filter,
    emulated_machine_filter,
    migration_domain_filter,
    migration_filter,
    network_filter,
    pin_to_host_filter,
)

FILTER_UNITS: tuple[PolicyUnit, ...] = (
    MEMORY,
    CPU,
    NETWORK,
    PIN_TO_HOST,
    MIGRATION,
    SWAP,
    CPU_OVERLOADED,
    CPU_TOPOLOGY,
    HUGEPAGES,
    EMULATED_MACHINE,
    CPU_LEVEL,
    CLUSTER_IN_MAINTENANCE,
    MIGRATION_DOMAIN,
)

__all__ = [
    "CLUSTER_IN_MAINTENANCE",
    "CPU",
    "CPU_LEVEL",
    "CPU_OVERCOMMIT_DURATION",
    "CPU_OVERLOADED",
    "CPU_TOPOLOGY",
    "EMULATED_MACHINE",
    "FILTER_UNITS",
    "HIGH_UTILIZATION",
    "HUGEPAGES",
    "MAX_ALLOWED_SWAP_USAGE",
    "MAX_NAMES_IN_REASON",
    "MEMORY",
    "MIGRATION",
    "MIGRATION_DOMAIN",
    "NETWORK",
    "PIN_TO_HOST",
    "SPM_VCPU_CONSUMPTION",
    "SWAP",
    "VCPU_CONSUMPTION_PCT",
    "cluster_in_maintenance_filter",
    "cpu_filter",
    "cpu_level_filter",
    "cpu_overloaded_filter",
    "cpu_topology_filter",
    "current_host_mask",
    "emulated_machine_filter",
    "fmt_num",
    "hugepages_filter",
    "hugepages_needed",
    "max_scheduling_memory_mb",
    "memory_filter",
    "migration_domain_filter",
    "migration_filter",
    "network_filter",
    "pin_to_host_filter",
    "spm_load_share",
    "swap_filter",
    "vm_memory_need_mb",
]
