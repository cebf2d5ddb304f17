"""oVirt's even distribution balance unit (EvenDistributionBalancePolicyUnit): CPU first, then memory.

The load model and the thresholds' meaning are balance_load's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.units.balance_load import (
    DEFAULT_DURATION_MIN,
    DEFAULT_HIGH,
    UTILIZATION_THRESHOLD_PCT,
    cpu_reason,
    destination_mask,
    effective_load,
    mem_limit,
    memory_reason,
    memory_sources,
    order_by,
    over_utilized,
)
from vmsched.scheduling.units.balance_search import Fit, MovableVms, find_migration
from vmsched.scheduling.units.base import BalanceOutcome, Props, prop_int
from vmsched.scheduling.units.helpers import VCPU_CONSUMPTION_PCT, max_scheduling_memory_mb


def even_distribution_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """oVirt EvenDistributionBalancePolicyUnit (CPU first, then memory).

    CPU: sources are over-utilized hosts (see the module doc), busiest (effective load) first;
    destinations are hosts whose effective load is below min(80% x High, High - 10). The VM is the
    first source's least CPU-hungry movable VM that fits a destination without pushing it over High;
    the candidates are the destinations it fits.

    Memory: sources have less max scheduling memory than MaxFreeMemoryForOverUtilized and run more
    than one VM (tightest first); destinations have more than MinFreeMemoryForUnderUtilized. Tried
    when the CPU pass finds no migration. As in oVirt, each threshold is 0 when unset, so without
    MaxFreeMemoryForOverUtilized no host is a memory source.
    """
    if int(np.count_nonzero(hosts.up)) < 2:
        return BalanceOutcome()
    high = float(prop_int(props, "HighUtilization", DEFAULT_HIGH))
    duration_s = 60.0 * prop_int(props, "CpuOverCommitDurationMinutes", DEFAULT_DURATION_MIN)
    max_free = mem_limit(props, "MaxFreeMemoryForOverUtilized", 0.0)
    min_free = mem_limit(props, "MinFreeMemoryForUnderUtilized", 0.0)
    load = effective_load(hosts)
    fit = Fit(hosts, high, max_free, load)
    dest_ok = destination_mask(hosts)
    by_host = MovableVms(vms)

    over, over_for = over_utilized(hosts, high, duration_s)
    low = min(UTILIZATION_THRESHOLD_PCT * high / 100.0, high - VCPU_CONSUMPTION_PCT)
    migration = find_migration(
        hosts,
        by_host,
        order_by(over, load, descending=True),
        dest_ok & (load < low),
        fit,
        cpu_reason(hosts, high, over_for),
    )
    if migration is None:
        sched = max_scheduling_memory_mb(hosts)
        migration = find_migration(
            hosts,
            by_host,
            memory_sources(hosts, max_free, 2),
            dest_ok & (sched > min_free),
            fit,
            memory_reason(hosts, max_free),
        )
    return BalanceOutcome(migration)


__all__ = ["even_distribution_balance"]
