"""The packing bound the report holds hosts used against: first-fit-decreasing of the live VMs'
demand into the cluster's hosts, largest first."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from vmsched.scheduling.hosts import HostTable

#: An item's size, one number per dimension.
Size = TypeVar("Size", bound=tuple[float, ...])


def first_fit_decreasing(
    items: Mapping[Size, int],
    capacities: Sequence[Sequence[float]],
) -> tuple[int, int]:
    """Bins used and items that fit nowhere; see `ffd_bins`."""
    used, overflow = ffd_bins(items, capacities)
    return int(used.sum()), overflow


def ffd_bins(
    items: Mapping[Size, int],
    capacities: Sequence[Sequence[float]],
) -> tuple[npt.NDArray[np.bool_], int]:
    """Pack `items` (size vector -> how many) into bins of `capacities` (one vector each, same
    dimensions), first fit, largest items first (by the first dimension, then the next), bins in
    the order given; an item fits a bin when every dimension does.

    Returns (which bins are used, items that fit nowhere). Identical items are placed together: first fit
    puts each copy in the first bin with room, so the copies fill the bins in order, each as far as
    it takes, which is one cumulative sum over the bins instead of a loop per copy.
    """
    if not capacities:
        return np.zeros(0, dtype=np.bool_), sum(items.values())
    free = np.array([list(c) for c in capacities], dtype=np.float64)
    used = np.zeros(len(free), dtype=np.bool_)
    overflow = 0
    for size, count in sorted(items.items(), key=lambda kv: tuple(-x for x in kv[0])):
        if count <= 0:
            continue
        need = np.asarray(size, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            per_dim = np.where(need > 0, np.floor(free / np.where(need > 0, need, 1.0)), np.inf)
        room = np.minimum(per_dim.min(axis=1), float(count))
        before = np.concatenate(([0.0], np.cumsum(room)[:-1]))
        take = np.clip(count - before, 0.0, room)
        free -= take[:, None] * need[None, :]
        used |= take > 0
        overflow += round(float(count - take.sum()))
    return used, overflow


def lower_bound(items: Mapping[Size, int], capacities: Sequence[Sequence[float]]) -> int:
    """The fewest bins any packing needs: per dimension, the fewest of the largest bins whose
    capacities add up to the items' total (ceil(sum demand / capacity) for bins of one size); the
    most over the dimensions. 0 without items; every bin when even all of them fall short."""
    if not capacities or not items:
        return 0
    caps = np.array([list(c) for c in capacities], dtype=np.float64)
    sizes = np.array([list(k) for k in items], dtype=np.float64)
    total = (sizes * np.array(list(items.values()), dtype=np.float64)[:, None]).sum(axis=0)
    need = 0
    for d in range(caps.shape[1]):
        if total[d] <= 0 or not np.isfinite(caps[:, d]).all():
            continue
        cum = np.cumsum(np.sort(caps[:, d])[::-1])
        # a hair of slack: sums of fractional loads must not ask for a bin of rounding noise
        need = max(need, min(int(np.searchsorted(cum, total[d] - 1e-6)) + 1, len(cum)))
    return need


def headroom_of(properties: Mapping[str, str]) -> float:
    """The CPU % a policy packs hosts to: its HighUtilization, 100 when it has none."""
    value = properties.get("HighUtilization")
    return float(value) if value else 100.0


def bins_of(
    table: HostTable, alive: Sequence[str], vcpus_per_cpu: float | None, cpu_limit_pct: float = 100.0
) -> list[tuple[float, float, float]]:
    """The hosts as bins, largest first: (memory placement may use (free memory and the overcommit
    limit both bind), vCPUs, CPU load in % of one CPU). vCPUs are unbounded without a vCPU ratio:
    the CPU filter only limits one VM's vCPUs to the host's CPUs; the load is bounded by
    `cpu_limit_pct` of every CPU (the policy's HighUtilization: the headroom it packs to)."""
    idx = table.index_of(alive)
    pct = min(100.0, float(table.settings.memory_overcommit_pct))
    mem = pct * table.physical_mem_mb[idx] / 100.0 - table.reserved_mem_mb[idx]
    cpus = table.effective_cpus[idx]
    vcpus = cpus * vcpus_per_cpu if vcpus_per_cpu is not None else np.full(len(idx), math.inf)
    load = cpus * cpu_limit_pct
    order = np.lexsort((np.asarray(alive), -load, -mem))  # largest memory first, then CPUs, then id
    return [(float(mem[i]), float(vcpus[i]), float(load[i])) for i in order]


__all__ = ["bins_of", "ffd_bins", "first_fit_decreasing", "headroom_of", "lower_bound"]
