"""The bounds the report holds a placement against: first-fit-decreasing of the live VMs' demand
into the cluster's hosts, largest first (packing), and the CPU spread no placement can go under
(evenness)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from vmsched.scheduling.hosts import HostTable

#: The packing bound's unit of CPU load, % of one CPU: the demand's loads are rounded to it.
LOAD_STEP = 25.0
#: An item's size, one number per dimension.
Size = TypeVar("Size", bound=tuple[float, ...])
#: Bins' capacities: one vector each, as a sequence or an (n, dimensions) array.
Capacities = Sequence[Sequence[float]] | npt.NDArray[np.float64]


def first_fit_decreasing(
    items: Mapping[Size, int],
    capacities: Capacities,
) -> tuple[int, int]:
    """Bins used and items that fit nowhere; see `ffd_bins`."""
    used, overflow = ffd_bins(items, capacities)
    return int(used.sum()), overflow


def ffd_bins(
    items: Mapping[Size, int],
    capacities: Capacities,
) -> tuple[npt.NDArray[np.bool_], int]:
    """Pack `items` (size vector -> how many) into bins of `capacities` (one vector each, same
    dimensions), first fit, largest items first (by the first dimension, then the next), bins in
    the order given; an item fits a bin when every dimension does.

    Returns (which bins are used, items that fit nowhere). Identical items are placed together: first fit
    puts each copy in the first bin with room, so the copies fill the bins in order, each as far as
    it takes, which is one cumulative sum over the bins instead of a loop per copy.
    """
    free = _array(capacities).copy()
    if not len(free):
        return np.zeros(0, dtype=np.bool_), sum(items.values())
    n = len(free)
    used = np.zeros(n, dtype=np.bool_)
    overflow = 0
    #: Bins past this one are untouched (free = capacity): a size's copies are worked out over the
    #: bins up to it and a few more, and over all only when those have too little room. First fit
    #: gives each bin what the bins before it left (a running sum), so the prefix's share is the
    #: same as over all bins and the bins after it get none.
    touched = 0
    for size, count in sorted(items.items(), key=lambda kv: tuple(-x for x in kv[0])):
        if count <= 0:
            continue
        need = np.asarray(size, dtype=np.float64)
        span = min(n, touched + max(64, count))
        while True:
            room = _room(free[:span], need, count)
            if span == n or room.sum() >= count:
                break
            span = min(n, 2 * span)
        before = np.concatenate(([0.0], np.cumsum(room)[:-1]))
        take = np.clip(count - before, 0.0, room)
        free[:span] -= take[:, None] * need[None, :]
        taken = take > 0
        used[:span] |= taken
        if taken.any():
            touched = max(touched, int(np.flatnonzero(taken)[-1]) + 1)
        overflow += round(float(count - take.sum()))
    return used, overflow


def _room(free: npt.NDArray[np.float64], need: npt.NDArray[np.float64], count: int) -> npt.NDArray[np.float64]:
    """How many items of size `need` each bin has room for, at most `count`."""
    with np.errstate(divide="ignore", invalid="ignore"):
        per_dim = np.where(need > 0, np.floor(free / np.where(need > 0, need, 1.0)), np.inf)
    room: npt.NDArray[np.float64] = np.minimum(per_dim.min(axis=1), float(count))
    return room


def _array(capacities: Sequence[Sequence[float]] | npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    if isinstance(capacities, np.ndarray):
        return capacities.astype(np.float64, copy=False)
    if not capacities:
        return np.zeros((0, 0), dtype=np.float64)
    return np.array([list(c) for c in capacities], dtype=np.float64)


def lower_bound(items: Mapping[Size, int], capacities: Capacities) -> int:
    """The fewest bins any packing needs: per dimension, the fewest of the largest bins whose
    capacities add up to the items' total (ceil(sum demand / capacity) for bins of one size); the
    most over the dimensions. 0 without items; every bin when even all of them fall short."""
    if not len(capacities) or not items:
        return 0
    cums = _largest_first_sums(_array(capacities))
    sizes = np.array([list(k) for k in items], dtype=np.float64)
    total = (sizes * np.array(list(items.values()), dtype=np.float64)[:, None]).sum(axis=0)
    need = 0
    for d, cum in enumerate(cums):
        if total[d] <= 0 or cum is None:
            continue
        # a hair of slack: sums of fractional loads must not ask for a bin of rounding noise
        need = max(need, min(int(np.searchsorted(cum, total[d] - 1e-6)) + 1, len(cum)))
    return need


#: The last capacities `_largest_first_sums` saw (a copy) and their sums.
_last_sums: tuple[npt.NDArray[np.float64], list[npt.NDArray[np.float64] | None]] | None = None


def _largest_first_sums(caps: npt.NDArray[np.float64]) -> list[npt.NDArray[np.float64] | None]:
    """Per dimension, the running sum of the bins' capacities largest first (None where a bin is
    unbounded); the same array of a report's samples is sorted once."""
    global _last_sums
    if _last_sums is not None and _last_sums[0].shape == caps.shape and np.array_equal(_last_sums[0], caps):
        return _last_sums[1]
    sums = [
        np.cumsum(np.sort(caps[:, d])[::-1]) if np.isfinite(caps[:, d]).all() else None for d in range(caps.shape[1])
    ]
    _last_sums = caps.copy(), sums
    return sums


def headroom_of(properties: Mapping[str, str]) -> float:
    """The CPU % a policy packs hosts to: its HighUtilization, 100 when it has none."""
    value = properties.get("HighUtilization")
    return float(value) if value else 100.0


def bins_of(
    table: HostTable, alive: Sequence[str], vcpus_per_cpu: float | None, cpu_limit_pct: float = 100.0
) -> npt.NDArray[np.float64]:
    """The hosts as bins, largest first, one row each: (memory placement may use (free memory and
    the overcommit limit both bind), vCPUs, CPU load in % of one CPU). vCPUs are unbounded without
    a vCPU ratio: the CPU filter only limits one VM's vCPUs to the host's CPUs; the load is bounded
    by `cpu_limit_pct` of every CPU (the policy's HighUtilization: the headroom it packs to).

    The hosts' sizes change only when hosts fail, come back or are replaced: the last answer is
    kept, with what it was made of, and given again (read-only) while that is all the same."""
    global _last_bins
    key = (tuple(table.ids), tuple(alive), vcpus_per_cpu, cpu_limit_pct, table.settings.memory_overcommit_pct)
    columns = (table.physical_mem_mb, table.reserved_mem_mb, table.effective_cpus)
    if (
        _last_bins is not None
        and _last_bins[0] == key
        and all(np.array_equal(a, b) for a, b in zip(_last_bins[1], columns, strict=True))
    ):
        return _last_bins[2]
    idx = table.index_of(alive)
    pct = min(100.0, float(table.settings.memory_overcommit_pct))
    mem = pct * table.physical_mem_mb[idx] / 100.0 - table.reserved_mem_mb[idx]
    cpus = table.effective_cpus[idx]
    vcpus = cpus * vcpus_per_cpu if vcpus_per_cpu is not None else np.full(len(idx), math.inf)
    load = cpus * cpu_limit_pct
    order = np.lexsort((np.asarray(alive), -load, -mem))  # largest memory first, then CPUs, then id
    bins = np.stack([mem[order], vcpus[order], load[order]], axis=1).astype(np.float64).reshape(len(order), 3)
    bins.flags.writeable = False
    _last_bins = key, tuple(np.array(c, copy=True) for c in columns), bins
    return bins


#: bins_of's last answer: what it was made of (a key, copies of the columns read) and the bins.
_last_bins: tuple[tuple[Any, ...], tuple[npt.NDArray[Any], ...], npt.NDArray[np.float64]] | None = None


def spread_floor(
    demand: Mapping[tuple[float, float, float], int], cpus: npt.NDArray[np.float64], cpu_pct: npt.NDArray[np.float64]
) -> tuple[float, float]:
    """The largest VM's CPU load in points of the largest host's CPU % (of hosts with `cpus` CPUs
    and `cpu_pct` CPU % now), and the CPU max-min no placement of the VMs can go under.

    Whichever host holds the largest VM is at least its points of the largest host (the cap at
    100 % aside), and the idlest host is at most the mean: max - min >= those points - the mean.
    `demand`'s loads (% of one CPU) are rounded to LOAD_STEP: half a step less keeps the bound one.
    """
    if not demand or not len(cpus):
        return 0.0, 0.0
    largest = max((size[2] for size, count in demand.items() if count > 0), default=0.0)
    points = max(0.0, largest - LOAD_STEP / 2.0) / max(float(cpus.max()), 1e-9)
    return points, max(0.0, min(points, 100.0) - float(cpu_pct.mean()))


__all__ = ["LOAD_STEP", "bins_of", "ffd_bins", "first_fit_decreasing", "headroom_of", "lower_bound", "spread_floor"]
