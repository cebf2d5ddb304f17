"""EvenCpuSpread: a unit that narrows the cluster's CPU spread itself (vmsched's, not oVirt's), by
where it places VMs and by migrations.

oVirt's EvenDistribution moves a VM only off a host over HighUtilization, so a cluster whose hosts
all sit under it never evens out (the generated day keeps a CPU max-min spread of 30 points). This
unit acts on the spread itself:

* As a weight (`spread_weight`): each host by the spread the hosts weighed would have with the VM
  on it, the VM's expected load counted (its cpu_usage_pct when the request gives one, oVirt's
  VcpuConsumptionPercentage per vCPU otherwise) over that host's CPUs, so a large VM goes where it
  adds fewest points (a host with more CPUs) and a small one raises the idlest host; ties to the
  host left least loaded. oVirt's CPU weight counts every new VM at VcpuConsumptionPercentage and
  rounds to whole %: on the generated day it put 16-vCPU VMs on 32-core hosts.
* As a balance unit, with hysteresis so it does not churn:

  - The *spread* is max - min of the Up hosts' effective load (balance_load: usage + SPM share +
    pending vCPUs), in points of host CPU %. Under SpreadThreshold there is nothing to do.
  - The imbalance must have *held* for ImbalanceHoldMinutes: over the window [as_of - hold, as_of],
    the least load some host had (its lowest sample in the window, and the sample in force when
    the window opened) exceeds by SpreadThreshold the most load some other host had. A host whose
    samples do not reach back to the window's start (its load changed within it, as a host's does
    in the simulator when a VM arrives or moves) is not judged; a host without samples has had its
    current load throughout. The hold is read from the samples: the unit keeps no state, so the
    balancer service and the simulator judge it alike.
  - The move (balance_spread_moves): every movable VM of the most-loaded hosts that have one
    (MAX_SOURCES of them), tried on every Up, enabled destination where it fits (load <=
    HighUtilization after it, scheduling memory left) without widening the cluster's spread. Its
    *gain* is the load (points) it takes out of the band [mean - SpreadThreshold/2,
    mean + SpreadThreshold/2] at its source and destination: a cluster whose hosts are all in the
    band has a spread under SpreadThreshold, a move inside the band gains nothing, and of two hosts
    tied at the top either may give (a max-min gain would be 0 until both had). The move kept gains
    most (ties: narrows the spread most, then table order) and must gain MinimumGainPercent, or the
    unit stays idle and says so. The candidates are the destinations where the VM gains that much;
    the selector picks among them under every filter.

Every pass that moves nothing says why (BalanceOutcome.idle_kind / idle): no imbalance, imbalance
not held long enough, or gain below margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from vmsched.contracts import VmReport, VmSpec
from vmsched.scheduling.hosts import FloatArray, HostTable
from vmsched.scheduling.units.balance_load import DEFAULT_HIGH, effective_load
from vmsched.scheduling.units.balance_spread_moves import MAX_SOURCES, search
from vmsched.scheduling.units.base import (
    BalanceOutcome,
    IdleKind,
    Migration,
    PolicyUnit,
    PropertySpec,
    Props,
    prop_float,
    prop_int,
)
from vmsched.scheduling.units.helpers import (
    HIGH_UTILIZATION,
    VCPU_CONSUMPTION_PCT,
    except_current_host,
    fmt_num,
    known_cpus,
)
from vmsched.scheduling.units.weights import WORST_WEIGHT

#: Hosts at each end of the load order whose sample windows are read for the hold.
HOLD_PROBE: Final = 8
#: The weight's tie-break: of two hosts that leave the spread alike, the one left less loaded (a
#: hundredth of a point per point of CPU %, under any difference of spread that matters).
SPREAD_TIE: Final = 0.01

SPREAD_THRESHOLD = PropertySpec(
    r"^([1-9]|[1-9][0-9])$", "8", "CPU max-min spread (points) above which EvenCpuSpread evens the cluster"
)
IMBALANCE_HOLD_MINUTES = PropertySpec(
    r"^([0-9]|[1-9][0-9]+)$", "5", "minutes a spread over SpreadThreshold must last before a migration"
)
MINIMUM_GAIN_PERCENT = PropertySpec(
    r"^([1-9]|[1-9][0-9])$", "1", "points a migration must narrow its source-destination gap by"
)


def _window(hosts: HostTable, i: int, start: float, current: float) -> tuple[float, float] | None:
    """(least, most) load host i had since `start` (None: its samples do not reach back that far)."""
    samples = hosts.cpu_samples[i]
    if len(samples) == 0:
        return current, current
    times, loads = samples.times, samples.loads
    if times[0] > start:
        return None
    j = len(times) - 1
    while j > 0 and times[j] > start:
        j -= 1
    seen = loads[j:]
    return float(min(seen)), float(max(seen))


def held_spread(hosts: HostTable, load: FloatArray, order: Sequence[int], hold_s: float) -> float:
    """The spread that has lasted `hold_s` up to as_of: the largest least-load of the busiest judged
    hosts minus the smallest most-load of the idlest (hosts in `order`, by load, ascending)."""
    start = hosts.as_of - hold_s if math.isfinite(hosts.as_of) else -math.inf
    if hold_s <= 0 or not math.isfinite(start):
        return float(load[order[-1]] - load[order[0]])
    top = [w[0] for i in reversed(order[-HOLD_PROBE:]) if (w := _window(hosts, i, start, float(load[i])))]
    bottom = [w[1] for i in order[:HOLD_PROBE] if (w := _window(hosts, i, start, float(load[i])))]
    if not top or not bottom:
        return 0.0
    return max(top) - min(bottom)


def even_spread_balance(hosts: HostTable, vms: Sequence[VmReport], props: Props) -> BalanceOutcome:
    """Move the VM that narrows the CPU spread most, once the spread has held (see the module doc)."""
    up = np.flatnonzero(hosts.up)
    if len(up) < 2:
        return BalanceOutcome(idle_kind=IdleKind.NO_IMBALANCE, idle="fewer than 2 Up hosts")
    high = prop_float(props, "HighUtilization", float(DEFAULT_HIGH))
    threshold = prop_float(props, "SpreadThreshold", 8.0)
    hold_s = 60.0 * prop_int(props, "ImbalanceHoldMinutes", 5)
    margin = prop_float(props, "MinimumGainPercent", 1.0)
    load = effective_load(hosts)
    order = [int(i) for i in up[np.argsort(load[up], kind="stable")]]
    spread = float(load[order[-1]] - load[order[0]])
    if spread <= threshold:
        return BalanceOutcome(
            idle_kind=IdleKind.NO_IMBALANCE,
            idle=f"CPU spread {fmt_num(round(spread, 1))} <= SpreadThreshold {fmt_num(threshold)} points",
        )
    held = held_spread(hosts, load, order, hold_s)
    if held <= threshold:
        return BalanceOutcome(
            idle_kind=IdleKind.NOT_HELD,
            idle=(
                f"CPU spread {fmt_num(round(spread, 1))} points has not stayed over SpreadThreshold"
                f" {fmt_num(threshold)} for ImbalanceHoldMinutes {fmt_num(hold_s / 60.0)}"
            ),
        )
    mean = float(load[up].mean())
    band = (mean - threshold / 2.0, mean + threshold / 2.0)
    return _best_move(hosts, vms, load, order, spread, band, high, margin)


def _best_move(
    hosts: HostTable,
    vms: Sequence[VmReport],
    load: FloatArray,
    order: list[int],
    spread: float,
    band: tuple[float, float],
    high: float,
    margin: float,
) -> BalanceOutcome:
    lo, hi = band
    found = search(hosts, vms, load, order, band, high, margin)
    move = found.move
    if move is not None:
        s = move.source
        return BalanceOutcome(
            Migration(
                move.vm.vm_id,
                hosts.ids[s],
                tuple(hosts.ids[d] for d in move.targets),
                f"CPU spread {fmt_num(round(spread, 1))} points: host {hosts.ids[s]} at"
                f" {fmt_num(round(float(load[s]), 1))}% gives a VM of {fmt_num(round(move.hunger, 1))}% of a CPU"
                f" (load outside the band less by {fmt_num(round(move.gain, 1))},"
                f" spread by {fmt_num(round(move.narrowed, 1))})",
            )
        )
    if found.best_gain == -math.inf:
        why = f"no movable VM of the {MAX_SOURCES} busiest hosts with one fits a host without widening the spread"
    else:
        why = (
            f"best move takes {fmt_num(round(found.best_gain, 1))} points of load outside the band"
            f" [{fmt_num(round(lo, 1))}, {fmt_num(round(hi, 1))}] < MinimumGainPercent {fmt_num(margin)}"
        )
    return BalanceOutcome(idle_kind=IdleKind.GAIN_BELOW_MARGIN, idle=why)


def spread_weight(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    """Lower is better: the CPU spread (max - min, points) of the hosts weighed with the VM on each,
    plus SPREAD_TIE x that host's CPU % after it. A host's load is its effective load (usage, SPM
    share, pending vCPUs at VcpuConsumptionPercentage); the VM adds its expected load
    (cpu_usage_pct x vCPUs; VcpuConsumptionPercentage per vCPU when it has none) over the host's
    CPUs, nothing on the host it runs on. WORST_WEIGHT where the CPUs are unknown."""
    known, cpus = known_cpus(hosts)
    if not known.any():
        return np.full(len(hosts), WORST_WEIGHT)
    per_vcpu = vm.cpu_usage_pct if vm.cpu_usage_pct > 0 else VCPU_CONSUMPTION_PCT
    load = effective_load(hosts)
    after = load + except_current_host(hosts, vm, per_vcpu * vm.vcpus) / cpus
    score = spread_after(np.where(known, load, np.nan), after) + SPREAD_TIE * after
    return score if known.all() else np.where(known, score, WORST_WEIGHT)


def spread_after(load: FloatArray, after: FloatArray) -> FloatArray:
    """Per host i, max - min of `load` with host i's load replaced by after[i] (NaN loads left out)."""
    if len(load) < 2:
        return np.zeros(len(load))
    top1, low1 = int(np.nanargmax(load)), int(np.nanargmin(load))
    rest = load.copy()
    rest[top1] = np.nan
    top2 = np.nanmax(rest) if np.isfinite(rest).any() else -math.inf
    rest = load.copy()
    rest[low1] = np.nan
    low2 = np.nanmin(rest) if np.isfinite(rest).any() else math.inf
    pos = np.arange(len(load))
    others_max = np.where(pos == top1, top2, load[top1])
    others_min = np.where(pos == low1, low2, load[low1])
    out: FloatArray = np.maximum(others_max, after) - np.minimum(others_min, after)
    return out


EVEN_CPU_SPREAD = PolicyUnit(
    name="EvenCpuSpread",
    description=(
        "Evens the CPU spread itself: prefers the host that leaves the hosts' max-min CPU spread"
        " narrowest with the VM's expected load on it; once the spread has stayed over SpreadThreshold"
        " for ImbalanceHoldMinutes, moves the VM of a busiest host that narrows it most (by at least"
        " MinimumGainPercent)."
    ),
    summary="CPU spread",
    weight=spread_weight,
    balance=even_spread_balance,
    properties={
        "HighUtilization": HIGH_UTILIZATION,
        "SpreadThreshold": SPREAD_THRESHOLD,
        "ImbalanceHoldMinutes": IMBALANCE_HOLD_MINUTES,
        "MinimumGainPercent": MINIMUM_GAIN_PERCENT,
    },
)

SPREAD_UNITS: tuple[PolicyUnit, ...] = (EVEN_CPU_SPREAD,)

__all__ = [
    "EVEN_CPU_SPREAD",
    "MAX_SOURCES",
    "SPREAD_TIE",
    "SPREAD_UNITS",
    "even_spread_balance",
    "held_spread",
    "spread_after",
    "spread_weight",
]
