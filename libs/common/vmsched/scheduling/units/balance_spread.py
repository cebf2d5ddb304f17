"""EvenCpuSpread: a balance unit that narrows the cluster's CPU spread itself (vmsched's, not oVirt's).

oVirt's EvenDistribution moves a VM only off a host over HighUtilization, so a cluster whose hosts
all sit under it never evens out (the generated day keeps a CPU max-min spread of 30 points). This
unit acts on the spread itself, with hysteresis so it does not churn:

* The *spread* is max - min of the Up hosts' effective load (balance_load: usage + SPM share +
  pending vCPUs), in points of host CPU %. Under SpreadThreshold there is nothing to do.
* The imbalance must have *held* for ImbalanceHoldMinutes: over the window [as_of - hold, as_of],
  the least load some host had (its lowest sample in the window, and the sample in force when the
  window opened) exceeds by SpreadThreshold the most load some other host had. A host whose
  samples do not reach back to the window's start (its load changed within it, as a host's does
  in the simulator when a VM arrives or moves) is not judged; a host without samples has had its
  current load throughout. The hold is read from the samples: the unit keeps no state, so the
  balancer service and the simulator judge it alike.
* The move: every movable VM of the most-loaded hosts that have one (MAX_SOURCES of them), tried
  on every Up, enabled destination where it fits (load <= HighUtilization after it, scheduling
  memory left) without widening the cluster's spread. Its *gain* is the load (points) it takes out
  of the band [mean - SpreadThreshold/2, mean + SpreadThreshold/2] at its source and destination:
  a cluster whose hosts are all in the band has a spread under SpreadThreshold, a move inside the
  band gains nothing, and of two hosts tied at the top either may give (a max-min gain would be 0
  until both had). The move kept gains most (ties: narrows the spread most, then table order) and
  must gain MinimumGainPercent, or the unit stays idle and says so. The candidates are the
  destinations where the VM gains that much; the selector picks among them under every filter.

Every pass that moves nothing says why (BalanceOutcome.idle_kind / idle): no imbalance, imbalance
not held long enough, or gain below margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import FloatArray, HostTable, IndexArray
from vmsched.scheduling.units.balance_load import DEFAULT_HIGH, cpu_hunger, destination_mask, effective_load
from vmsched.scheduling.units.balance_search import MovableVms
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
from vmsched.scheduling.units.helpers import HIGH_UTILIZATION, fmt_num, max_scheduling_memory_mb

#: The most-loaded hosts whose VMs a pass tries (the spread's top is there; more costs time only).
MAX_SOURCES: Final = 3
#: The busiest hosts looked at for those MAX_SOURCES with a VM the unit may move.
SOURCE_SCAN: Final = 20
#: Hosts at each end of the load order whose sample windows are read for the hold.
HOLD_PROBE: Final = 8

SPREAD_THRESHOLD = PropertySpec(
    r"^([1-9]|[1-9][0-9])$", "6", "CPU max-min spread (points) above which EvenCpuSpread evens the cluster"
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
    threshold = prop_float(props, "SpreadThreshold", 6.0)
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
    cpus = hosts.effective_cpus
    sched = max_scheduling_memory_mb(hosts)
    dest = np.flatnonzero(destination_mask(hosts) & (cpus > 0))
    # The spread's ends without the source and the destination: the 3 highest and lowest are enough.
    highs, lows = order[::-1][:3], order[:3]
    by_host = MovableVms(vms)
    best: tuple[float, float] | None = None
    pick: Migration | None = None
    best_gain = -math.inf
    sources = 0
    for s in order[::-1][:SOURCE_SCAN]:
        movable = by_host.on(hosts.ids[s]) if cpus[s] > 0 else []
        if not movable:  # nothing it may give (all resting, in flight, or its host out of budget)
            continue
        sources += 1
        if sources > MAX_SOURCES:
            break
        for vm in movable:
            hunger = cpu_hunger(vm)
            new_src = float(load[s]) - hunger / float(cpus[s])
            new_dst = load[dest] + hunger / cpus[dest]
            fits = (new_dst <= high) & (sched[dest] - float(vm_cost(vm).mem_mb) > 0.0) & (dest != s)
            # The load outside the band [mean - T/2, mean + T/2] the move takes away, at both ends.
            gain = (_excess(float(load[s]), lo, hi) - _excess(new_src, lo, hi)) + (
                _excess(load[dest], lo, hi) - _excess(new_dst, lo, hi)
            )
            rest_max = _end([i for i in highs if i != s], dest, load, -math.inf)
            rest_min = _end([i for i in lows if i != s], dest, load, math.inf)
            top = np.maximum(np.maximum(rest_max, new_dst), new_src)
            after = top - np.minimum(np.minimum(rest_min, new_dst), new_src)
            narrowed = spread - after
            ok = fits & (narrowed >= 0.0)
            if not ok.any():
                continue
            best_gain = max(best_gain, float(gain[ok].max()))
            good = ok & (gain >= margin)
            if not good.any():
                continue
            k = int(np.lexsort((-narrowed[good], -gain[good]))[0])
            score = (float(gain[good][k]), float(narrowed[good][k]))
            if best is None or score > best:
                best = score
                names = tuple(hosts.ids[int(d)] for d in dest[good])
                pick = Migration(
                    vm.vm_id,
                    hosts.ids[s],
                    names,
                    f"CPU spread {fmt_num(round(spread, 1))} points: host {hosts.ids[s]} at"
                    f" {fmt_num(round(float(load[s]), 1))}% gives a VM of {fmt_num(round(hunger, 1))}% of a CPU"
                    f" (load outside the band less by {fmt_num(round(score[0], 1))},"
                    f" spread by {fmt_num(round(score[1], 1))})",
                )
    if pick is not None:
        return BalanceOutcome(pick)
    if best_gain == -math.inf:
        why = f"no movable VM of the {MAX_SOURCES} busiest hosts with one fits a host without widening the spread"
    else:
        why = (
            f"best move takes {fmt_num(round(best_gain, 1))} points of load outside the band"
            f" [{fmt_num(round(lo, 1))}, {fmt_num(round(hi, 1))}] < MinimumGainPercent {fmt_num(margin)}"
        )
    return BalanceOutcome(idle_kind=IdleKind.GAIN_BELOW_MARGIN, idle=why)


def _excess(load: Any, lo: float, hi: float) -> Any:
    """Points of load above `hi` or below `lo` (per host, for a number or an array)."""
    return np.maximum(load - hi, 0.0) + np.maximum(lo - load, 0.0)


def _end(ends: list[int], dest: IndexArray, load: FloatArray, none: float) -> FloatArray:
    """Per destination d, the load of the first of `ends` (hosts at one end of the load order, the
    source left out) that is not d; `none` when there is none."""
    first = float(load[ends[0]]) if ends else none
    second = float(load[ends[1]]) if len(ends) > 1 else none
    out: FloatArray = np.where(dest == ends[0], second, first) if ends else np.full(len(dest), none)
    return out


EVEN_CPU_SPREAD = PolicyUnit(
    name="EvenCpuSpread",
    description=(
        "Balances the CPU spread itself: once the max-min spread has stayed over SpreadThreshold for"
        " ImbalanceHoldMinutes, moves the VM of a busiest host that narrows it most (by at least"
        " MinimumGainPercent)."
    ),
    summary="CPU spread",
    balance=even_spread_balance,
    properties={
        "HighUtilization": HIGH_UTILIZATION,
        "SpreadThreshold": SPREAD_THRESHOLD,
        "ImbalanceHoldMinutes": IMBALANCE_HOLD_MINUTES,
        "MinimumGainPercent": MINIMUM_GAIN_PERCENT,
    },
)

SPREAD_UNITS: tuple[PolicyUnit, ...] = (EVEN_CPU_SPREAD,)

__all__ = ["EVEN_CPU_SPREAD", "MAX_SOURCES", "SPREAD_UNITS", "even_spread_balance", "held_spread"]
