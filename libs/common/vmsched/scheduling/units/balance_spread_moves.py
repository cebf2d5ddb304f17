"""EvenCpuSpread's move search: the movable VMs of the busiest hosts against every destination at
once, as (VM x destination) arrays, each move scored by the load it takes out of the band.

The same moves and the same pick as trying each VM in turn on every destination (what the unit did
before), at half the time of a pass: one array operation per pass, not one per VM.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import FloatArray, HostTable, IndexArray
from vmsched.scheduling.units.balance_load import cpu_hunger, destination_mask
from vmsched.scheduling.units.balance_search import MovableVms
from vmsched.scheduling.units.helpers import max_scheduling_memory_mb

#: The most-loaded hosts whose VMs a pass tries. More (the 8 busiest, so VMs of middle hosts may go
#: to the idlest) measured a wider spread on the generated day: they find more moves that gain the
#: margin away from the top, which spend the cluster's and the hosts' hourly budgets the top then lacks.
MAX_SOURCES: Final = 3
#: The busiest hosts looked at for those MAX_SOURCES with a VM the unit may move.
SOURCE_SCAN: Final = 20
#: Hosts at each end of the load order kept for the spread after a move (a move changes two).
ENDS: Final = 3


@dataclass(frozen=True)
class Move:
    """The best move of a pass: `vm` off host `source` (table position), with its CPU hunger, what
    it gains and how much it narrows the spread, and every destination where it gains the margin."""

    vm: VmReport
    source: int
    hunger: float
    gain: float
    narrowed: float
    targets: tuple[int, ...]


@dataclass(frozen=True)
class Search:
    """What a pass found: the best move (None: none gains the margin), the most a move that fits
    gains (-inf: none fits without widening the spread), and how many sources were tried."""

    move: Move | None
    best_gain: float
    sources: int


def excess(load: Any, lo: float, hi: float) -> Any:
    """Points of load above `hi` or below `lo` (per host, for a number or an array)."""
    return np.maximum(load - hi, 0.0) + np.maximum(lo - load, 0.0)


def _rest(ends: Sequence[int], src: IndexArray, dst: IndexArray, load: FloatArray, none: float) -> FloatArray:
    """Per (VM, destination), the load of the first of `ends` (hosts at one end of the load order)
    that is neither the VM's source nor the destination; `none` when every one is."""
    out: FloatArray = np.full(np.broadcast_shapes(src.shape, dst.shape), none)
    for e in reversed(ends):
        out = np.where((src != e) & (dst != e), float(load[e]), out)
    return out


def _sources(hosts: HostTable, vms: Sequence[VmReport], order: list[int]) -> tuple[list[VmReport], list[int], int]:
    """The movable VMs of the MAX_SOURCES busiest hosts with one (among the SOURCE_SCAN busiest),
    each with its host's position, and how many such hosts there were."""
    by_host = MovableVms(vms)
    cpus = hosts.effective_cpus
    picked: list[VmReport] = []
    src_of: list[int] = []
    sources = 0
    for s in order[::-1][:SOURCE_SCAN]:
        movable = by_host.on(hosts.ids[s]) if cpus[s] > 0 else []
        if not movable:  # nothing it may give (all resting, in flight, or its host out of budget)
            continue
        sources += 1
        picked += movable
        src_of += [s] * len(movable)
        if sources == MAX_SOURCES:
            break
    return picked, src_of, sources


def search(
    hosts: HostTable,
    vms: Sequence[VmReport],
    load: FloatArray,
    order: list[int],
    band: tuple[float, float],
    high: float,
    margin: float,
) -> Search:
    """The move that takes the most load out of `band` (ties: narrows the spread most, then the
    sources' order and the VMs' order), among those that fit (load <= `high` after it, scheduling
    memory left) without widening the spread; see balance_spread."""
    lo, hi = band
    cpus = hosts.effective_cpus
    dest = np.flatnonzero(destination_mask(hosts) & (cpus > 0))
    picked, src_of, sources = _sources(hosts, vms, order)
    if not picked or not len(dest):
        return Search(None, -math.inf, sources)
    src = np.asarray(src_of, dtype=np.intp)[:, None]
    hunger = np.fromiter((cpu_hunger(v) for v in picked), dtype=np.float64, count=len(picked))[:, None]
    need = np.fromiter((float(vm_cost(v).mem_mb) for v in picked), dtype=np.float64, count=len(picked))[:, None]
    dst = dest[None, :]
    new_src = load[src] - hunger / cpus[src]
    new_dst = load[dst] + hunger / cpus[dst]
    fits = (new_dst <= high) & (max_scheduling_memory_mb(hosts)[dst] - need > 0.0) & (dst != src)
    # The load outside the band [mean - T/2, mean + T/2] the move takes away, at both ends.
    gain = (excess(load[src], lo, hi) - excess(new_src, lo, hi)) + (excess(load[dst], lo, hi) - excess(new_dst, lo, hi))
    highs, lows = order[::-1][:ENDS], order[:ENDS]
    top = np.maximum(np.maximum(_rest(highs, src, dst, load, -math.inf), new_dst), new_src)
    bottom = np.minimum(np.minimum(_rest(lows, src, dst, load, math.inf), new_dst), new_src)
    narrowed = float(load[order[-1]] - load[order[0]]) - (top - bottom)
    ok = fits & (narrowed >= 0.0)
    if not ok.any():
        return Search(None, -math.inf, sources)
    best_gain = float(gain[ok].max())
    good = ok & (gain >= margin)
    if not good.any():
        return Search(None, best_gain, sources)
    # Most gain, then most narrowed; lexsort is stable, so ties go to the first VM, then destination.
    first = int(np.lexsort((-np.where(good, narrowed, -math.inf).ravel(), -np.where(good, gain, -math.inf).ravel()))[0])
    v, d = divmod(first, len(dest))
    targets = tuple(int(i) for i in dest[good[v]])
    return Search(
        Move(picked[v], src_of[v], float(hunger[v, 0]), float(gain[v, d]), float(narrowed[v, d]), targets),
        best_gain,
        sources,
    )


__all__ = ["ENDS", "MAX_SOURCES", "SOURCE_SCAN", "Move", "Search", "excess", "search"]
