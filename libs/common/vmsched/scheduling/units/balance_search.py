"""How a balance unit finds its migration fast: the movable VMs grouped by host, what a destination
must leave after the VM, and bounds that rule out a host or a VM before the exact test.

`find_migration` decides exactly as the straightforward scan (each source in order, its movable
VMs least CPU-hungry first, each tested against every destination on the whole table), without
reading every VM for every source host (tests/unit/test_balance_fast.py holds it to that).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from vmsched.contracts import VmReport
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, IndexArray
from vmsched.scheduling.units.balance_load import by_hunger, cpu_hunger
from vmsched.scheduling.units.base import Migration, VmsByHost
from vmsched.scheduling.units.helpers import max_scheduling_memory_mb


class MovableVms:
    """The movable VMs of each host, in the order given.

    The first lookup scans the list: most passes look at one source host. A second lookup means the
    pass walks sources, possibly every host: the VMs are then grouped by host once, with each host's
    least CPU hunger and least guest memory, so a host none of whose VMs can fit is skipped without
    touching them (reading 200,000 VM objects host by host, in no memory order, costs more than the
    rest of the pass)."""

    __slots__ = ("_by_host", "_ends", "_looked_up", "_min_guest", "_min_hunger", "_order", "_slot", "_vms")

    def __init__(self, vms: Sequence[VmReport]) -> None:
        self._vms = vms
        self._looked_up = False
        self._slot: dict[str | None, int] | None = None
        #: The VMs as given host by host, when they are: then a lookup reads that host's only.
        self._by_host = vms if isinstance(vms, VmsByHost) else None

    def _group(self) -> dict[str | None, int]:
        slot: dict[str | None, int] = {}
        n = len(self._vms)
        host = np.fromiter((slot.setdefault(v.host_id, len(slot)) for v in self._vms), dtype=np.intp, count=n)
        hunger = np.fromiter((cpu_hunger(v) for v in self._vms), dtype=np.float64, count=n)
        guest = np.fromiter((v.mem_mb for v in self._vms), dtype=np.float64, count=n)
        self._order = np.argsort(host, kind="stable")  # stable: each host's VMs keep their order
        starts = np.searchsorted(host[self._order], np.arange(len(slot)))
        self._ends = [*starts[1:].tolist(), n]
        self._min_hunger = np.minimum.reduceat(hunger[self._order], starts) if n else np.zeros(0)
        self._min_guest = np.minimum.reduceat(guest[self._order], starts) if n else np.zeros(0)
        self._slot = slot
        return slot

    def on(self, host_id: str, dest: Destinations | None = None) -> list[VmReport]:
        """The host's VMs; with `dest`, none when every one of them certainly fits none of `dest`."""
        if self._by_host is not None:
            found = self._by_host.on(host_id)
            if dest is not None and found:
                least = min(cpu_hunger(v) for v in found), min(float(v.mem_mb) for v in found)
                if not dest.may_fit(*least):
                    return []
            return found
        if self._slot is None and not self._looked_up:
            self._looked_up = True
            return [v for v in self._vms if v.host_id == host_id]
        slot = self._slot if self._slot is not None else self._group()
        k = slot.get(host_id)
        if k is None:
            return []
        if dest is not None and not dest.may_fit(float(self._min_hunger[k]), float(self._min_guest[k])):
            return []
        start = self._ends[k - 1] if k else 0
        return [self._vms[i] for i in self._order[start : self._ends[k]].tolist()]


class Fit:
    """What a destination must leave: load <= high after the VM, scheduling memory > min_free_mb
    after it; with the table's columns it compares, computed once per pass."""

    def __init__(self, hosts: HostTable, high: float, min_free_mb: float, load: FloatArray) -> None:
        self.high, self.min_free_mb, self.load = high, min_free_mb, load
        self.cpus = hosts.effective_cpus
        self.known = self.cpus > 0
        self.sched = max_scheduling_memory_mb(hosts)

    def among(self, mask: BoolArray) -> Destinations:
        return Destinations(self, np.flatnonzero(mask & self.known))


class Destinations:
    """The hosts a source's VM may go to (a destination mask, hosts with a known CPU count only: a VM
    never fits one without), with what `Fit` compares at those hosts.

    `fits` is exact: load + hunger / CPUs <= high and scheduling memory - need > min free, on each
    host, as NumPy computes it on the whole table. Before it, two bounds rule out in O(1) a VM that
    fits no host: rounding is monotone, so no host's load + hunger / CPUs is below
    min(load) + hunger / max(CPUs), and none's memory - need above max(memory) - guest memory (a
    host's least hunger and least guest memory bound all its VMs the same way). A bound that is NaN
    rules nothing out."""

    def __init__(self, fit: Fit, positions: IndexArray) -> None:
        self.high, self.min_free_mb = fit.high, fit.min_free_mb
        self.positions = positions
        self.load, self.cpus, self.sched = fit.load[positions], fit.cpus[positions], fit.sched[positions]
        empty = len(positions) == 0
        self.min_load = math.inf if empty else float(self.load.min())
        self.max_cpus = 1.0 if empty else float(self.cpus.max())
        self.max_sched = -math.inf if empty else float(self.sched.max())

    def may_fit(self, hunger: float, guest_mb: float) -> bool:
        """False when a VM this hungry, with this much guest memory or more, certainly fits none of
        these hosts (its need, vm_cost's memory, is the guest memory plus overhead)."""
        return not (self.min_load + hunger / self.max_cpus > self.high or self.max_sched - guest_mb <= self.min_free_mb)

    def fits(self, hunger: float, need_mb: float, source: int) -> list[int]:
        """Positions (table order) of the hosts other than `source` the VM fits."""
        ok = (self.load + hunger / self.cpus <= self.high) & (self.sched - need_mb > self.min_free_mb)
        return [p for p in self.positions[ok].tolist() if p != source]


def find_migration(
    hosts: HostTable,
    vms: MovableVms,
    sources: Sequence[int],
    destinations: BoolArray | Destinations,
    fit: Fit,
    reason: Callable[[int], str],
) -> Migration | None:
    """The first source (in the given order) with a movable VM that fits a destination; that
    source's least CPU-hungry such VM, with every destination it fits as the candidates."""
    if not sources:
        return None
    dest = destinations if isinstance(destinations, Destinations) else fit.among(destinations)
    if len(dest.positions) == 0:
        return None
    for s in sources:
        # Only a VM that may fit somewhere needs sorting and the exact test.
        hopeful = [v for v in vms.on(hosts.ids[s], dest) if dest.may_fit(cpu_hunger(v), float(v.mem_mb))]
        for vm in by_hunger(hopeful):
            fits = dest.fits(cpu_hunger(vm), float(vm_cost(vm).mem_mb), s)
            if fits:
                return Migration(vm.vm_id, hosts.ids[s], tuple(hosts.ids[i] for i in fits), reason(s))
    return None


__all__ = ["Destinations", "Fit", "MovableVms", "find_migration"]
