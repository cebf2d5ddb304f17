"""A cluster's hosts as columns (NumPy arrays), the plain data every policy unit computes on.

Units see a HostTable restricted to the hosts still in play; each column is one array (or tuple)
aligned with `ids`, so a unit is a handful of vectorized expressions, not a loop over host objects.
Pending resources are already folded in as their own columns (oVirt's scheduler API: "whatever
usage data is passed ... must pass the used and the pending resources together"); a unit adds them where its
formula needs. `as_of` is the decision's instant, for units that judge time (heartbeats, load
duration): units never read the clock themselves.

Columns come in three groups, declared once below: numeric (float arrays), boolean arrays, and
per-host Python objects (sets, mappings) that no array can hold. Adding a host attribute means
adding it to one group (_NUMERIC, _BOOLEAN or _OBJECT) and to HostTable's fields.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from vmsched.contracts import ClusterReport, HostState, HostStatus, PendingEntry

T = TypeVar("T")
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]


_NOTHING: frozenset[str] = frozenset()


class Rows(Sequence[T]):
    """The items of a column at some positions, looked up when read (a sub-table's object column).

    Copying every per-host object column on every sub-table cost more than the units that read
    them; a Rows holds the parent column and the positions, and becomes a tuple on first iteration.
    """

    __slots__ = ("_base", "_items", "_rows")

    def __init__(self, base: Sequence[T], rows: list[int]) -> None:
        self._base, self._rows = base, rows
        self._items: tuple[T, ...] | None = None

    @classmethod
    def pick(cls, column: Sequence[T], rows: list[int]) -> Sequence[T]:
        if isinstance(column, Rows):  # compose, so reads never go through a chain of views
            if column._items is not None:
                return cls(column._items, rows)
            return cls(column._base, [column._rows[r] for r in rows])
        return cls(column, rows)

    def _tuple(self) -> tuple[T, ...]:
        if self._items is None:
            self._items = tuple(map(self._base.__getitem__, self._rows))
        return self._items

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return self._tuple()[i]
        if self._items is not None:
            return self._items[i]
        return self._base[self._rows[i]]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[T]:
        return iter(self._tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return f"Rows({list(self)!r})"


class CpuSamples(Sequence[tuple[float, float]]):
    """A host's recent CPU load reports, oldest first, as (unix time, percent) pairs.

    Kept as two arrays of C doubles: a host has up to 120 samples (the state tracker's
    CPU_SAMPLES_KEPT), which as tuples of Python floats take ~13 KB a host, 130 MB of a
    10,000-host cluster's table, and here 2 KB. A pair read by index is built on each read: a walk
    over many samples reads `loads` and `times` instead, as fast as indexing a tuple.
    """

    __slots__ = ("loads", "times")

    def __init__(self, pairs: Iterable[tuple[float, float]] = ()) -> None:
        times, loads = tuple(zip(*pairs, strict=True)) or ((), ())
        self.times = array("d", times)
        self.loads = array("d", loads)

    @overload
    def __getitem__(self, i: int) -> tuple[float, float]: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[tuple[float, float]]: ...
    def __getitem__(self, i: int | slice) -> tuple[float, float] | Sequence[tuple[float, float]]:
        if isinstance(i, slice):
            return tuple(zip(self.times[i], self.loads[i], strict=True))
        return self.times[i], self.loads[i]

    def __len__(self) -> int:
        return len(self.times)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self.times, self.loads, strict=True)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CpuSamples):
            return self.times == other.times and self.loads == other.loads
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"CpuSamples({list(self)!r})"


_NO_SAMPLES = CpuSamples()


def _samples(pairs: Sequence[tuple[float, float]]) -> CpuSamples:
    return CpuSamples(pairs) if pairs else _NO_SAMPLES


def _ts(value: Any) -> float:
    return value.timestamp() if value is not None else math.nan


#: What a host without any entries in a map column holds: one object for every such host (an
#: empty dict per host per column is 2.5 MB at 10,000 hosts), and read-only, as it is shared.
_NO_ENTRIES: Mapping[Any, Any] = MappingProxyType({})


def _set(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values) or _NOTHING


def _map(values: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return values or _NO_ENTRIES


#: name -> how to read it from a HostState. Order is the order of HostTable's float fields.
_NUMERIC: dict[str, Callable[[HostState], float]] = {
    "cpu_sockets": lambda h: h.report.cpu_sockets,
    "cpu_cores": lambda h: h.report.cpu_cores,
    "cpu_threads": lambda h: h.report.cpu_threads,
    "cpu_usage_pct": lambda h: h.report.cpu_usage_pct,
    "physical_mem_mb": lambda h: h.report.physical_mem_mb,
    "mem_free_mb": lambda h: h.report.mem_free_mb,
    "swap_total_mb": lambda h: h.report.swap_total_mb,
    "swap_free_mb": lambda h: h.report.swap_free_mb,
    "reserved_mem_mb": lambda h: h.report.reserved_mem_mb,
    "disk_total_mb": lambda h: h.report.disk_total_mb,
    "disk_free_mb": lambda h: h.report.disk_free_mb,
    "num_io_ops": lambda h: h.report.num_io_ops,
    "hypervisor_version": lambda h: h.report.hypervisor_version,
    "reported_at": lambda h: _ts(h.report.reported_at),
    "vm_count": lambda h: h.vm_count,
    "mem_committed_mb": lambda h: h.mem_committed_mb,
    "vcpus_committed": lambda h: h.vcpus_committed,
    "cpus_pinned": lambda h: h.cpus_pinned,
    "ha_vm_count": lambda h: h.ha_vm_count,
    "build_failures": lambda h: h.build_failures,
    "cpu_last_sample_pct": lambda h: h.cpu_samples[-1][1] if h.cpu_samples else math.nan,
}
_BOOLEAN: dict[str, Callable[[HostState], bool]] = {
    "up": lambda h: h.report.status is HostStatus.UP,
    "is_spm": lambda h: h.report.is_spm,
    "enabled": lambda h: h.report.enabled,
}
_OBJECT: dict[str, Callable[[HostState], Any]] = {
    "networks": lambda h: _set(h.report.networks),
    "vm_ids": lambda h: _set(h.vm_ids),
    "arch": lambda h: h.report.arch,
    "hypervisor_type": lambda h: h.report.hypervisor_type,
    "cpu_models": lambda h: _set(h.report.cpu_models),
    "emulated_machines": lambda h: _set(h.report.emulated_machines),
    "hugepages_free": lambda h: _map(h.report.hugepages_free),
    "labels": lambda h: _map(h.report.labels),
    "host_groups": lambda h: _set(h.report.host_groups),
    "capabilities": lambda h: _map(h.report.capabilities),
    "metrics": lambda h: _map(h.report.metrics),
    "cpu_samples": lambda h: _samples(h.cpu_samples),
}
#: Object columns whose values are immutable and mostly the same on many hosts (every host on the
#: same networks, of one architecture): HostTable.from_states keeps one object per distinct value.
_SHARED: frozenset[str] = frozenset(
    {"networks", "arch", "hypervisor_type", "cpu_models", "emulated_machines", "host_groups"}
)
#: Filled by HostTable.with_pending, zero in a table straight from the state.
PENDING_COLUMNS: tuple[str, ...] = ("pending_mem_mb", "pending_vcpus", "pending_cpus_pinned", "pending_vm_count")
NUMERIC_COLUMNS: tuple[str, ...] = (*_NUMERIC, *PENDING_COLUMNS)
BOOLEAN_COLUMNS: tuple[str, ...] = tuple(_BOOLEAN)
OBJECT_COLUMNS: tuple[str, ...] = (*_OBJECT, "pending_vm_ids")


@dataclass(frozen=True, eq=False)
class HostTable:
    """Hosts of one cluster, one array per attribute, all aligned with `ids`."""

    ids: tuple[str, ...]
    settings: ClusterReport
    # numeric
    cpu_sockets: FloatArray
    cpu_cores: FloatArray
    cpu_threads: FloatArray
    cpu_usage_pct: FloatArray
    physical_mem_mb: FloatArray
    mem_free_mb: FloatArray
    swap_total_mb: FloatArray
    swap_free_mb: FloatArray
    reserved_mem_mb: FloatArray
    disk_total_mb: FloatArray
    disk_free_mb: FloatArray
    num_io_ops: FloatArray
    hypervisor_version: FloatArray
    #: Unix time of the host's last report (NaN if it never said): its heartbeat.
    reported_at: FloatArray
    vm_count: FloatArray
    mem_committed_mb: FloatArray
    vcpus_committed: FloatArray
    cpus_pinned: FloatArray
    ha_vm_count: FloatArray
    build_failures: FloatArray
    #: The load of the host's newest CPU sample (NaN without samples): most hosts are not over
    #: a threshold now, and this column says so without walking their samples.
    cpu_last_sample_pct: FloatArray
    pending_mem_mb: FloatArray
    pending_vcpus: FloatArray
    pending_cpus_pinned: FloatArray
    pending_vm_count: FloatArray
    # boolean
    up: BoolArray
    is_spm: BoolArray
    enabled: BoolArray
    # per-host objects
    networks: Sequence[frozenset[str]]
    vm_ids: Sequence[frozenset[str]]
    arch: Sequence[str]
    hypervisor_type: Sequence[str]
    cpu_models: Sequence[frozenset[str]]
    emulated_machines: Sequence[frozenset[str]]
    hugepages_free: Sequence[Mapping[int, int]]
    labels: Sequence[Mapping[str, str]]
    host_groups: Sequence[frozenset[str]]
    capabilities: Sequence[Mapping[str, Any]]
    metrics: Sequence[Mapping[str, float]]
    cpu_samples: Sequence[CpuSamples]
    #: VMs placed here but not yet running (pending records), for affinity.
    pending_vm_ids: Sequence[frozenset[str]]
    #: The decision's instant (unix seconds); NaN when no request set it.
    as_of: float = math.nan
    #: The whole cluster this table was taken from (None: this is it), for units that must look
    #: beyond the hosts still in play (where do a group's other VMs run?).
    _cluster: HostTable | None = field(default=None, repr=False)
    #: host id -> position; built on first lookup (most sub-tables are never searched by id).
    _index: dict[str, int] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            object.__setattr__(self, "_index", {h: i for i, h in enumerate(self.ids)})
        assert self._index is not None
        return self._index

    def columns(self) -> dict[str, Any]:
        """Every column by name (for building a modified copy)."""
        return {name: getattr(self, name) for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS, *OBJECT_COLUMNS)}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_states(cls, hosts: Iterable[HostState], settings: ClusterReport) -> HostTable:
        """The table of `hosts`, in their order.

        `hosts` is read once and no state is kept: fed a generator that parses stored records one
        at a time (as StateCache does), the table is built with one parsed model alive at a time.
        """
        numeric = tuple(_NUMERIC.values())
        boolean = tuple(_BOOLEAN.values())
        objects = tuple(_OBJECT.values())
        ids: list[str] = []
        # Rows go straight into flat arrays of C numbers: no float object per value on the way.
        numbers = array("d")
        flags = array("b")
        values: tuple[list[Any], ...] = tuple([] for _ in objects)
        distinct: tuple[dict[Any, Any] | None, ...] = tuple({} if name in _SHARED else None for name in _OBJECT)
        for h in hosts:
            ids.append(h.report.host_id)
            numbers.extend([g(h) for g in numeric])
            flags.extend([g(h) for g in boolean])
            for column, g, seen in zip(values, objects, distinct, strict=True):
                value = g(h)
                column.append(value if seen is None else seen.setdefault(value, value))
        n = len(ids)
        block = np.frombuffer(numbers, dtype=np.float64).reshape(n, len(numeric))
        cols: dict[str, Any] = {name: np.array(block[:, j]) for j, name in enumerate(_NUMERIC)}
        zeros = np.zeros(n, dtype=np.float64)
        cols.update({name: zeros for name in PENDING_COLUMNS})
        bits = np.frombuffer(flags, dtype=np.int8).reshape(n, len(boolean))
        cols.update({name: bits[:, j] != 0 for j, name in enumerate(_BOOLEAN)})
        cols.update({name: tuple(column) for name, column in zip(_OBJECT, values, strict=True)})
        cols["pending_vm_ids"] = (_NOTHING,) * n
        return cls(ids=tuple(ids), settings=settings, **cols)

    def with_pending(self, entries: Iterable[PendingEntry], *, now: float | None = None) -> HostTable:
        """A copy with the pending columns summed from `entries` (other hosts' entries are ignored),
        evaluated at `now` when given."""
        n = len(self)
        mem, vcpus, pinned, count = (np.zeros(n, dtype=np.float64) for _ in range(4))
        # Most hosts have nothing pending: they share one empty set.
        vm_ids: list[frozenset[str]] = [_NOTHING] * n
        index = self.index
        for e in entries:
            i = index.get(e.host_id)
            if i is None:
                continue
            mem[i] += e.mem_mb
            vcpus[i] += e.vcpus
            pinned[i] += e.cpus_pinned
            count[i] += 1
            vm_ids[i] = vm_ids[i] | {e.vm_id}
        return replace(
            self,
            pending_mem_mb=mem,
            pending_vcpus=vcpus,
            pending_cpus_pinned=pinned,
            pending_vm_count=count,
            pending_vm_ids=tuple(vm_ids),
            as_of=self.as_of if now is None else now,
            _index=self._index,
        )

    def with_rows(self, changed: Mapping[str, HostState], settings: ClusterReport | None = None) -> HostTable | None:
        """A copy with the rows of `changed` hosts replaced, or None if one of them is new here.

        The state caches use this to move from one version to the next in O(changed hosts)
        instead of rebuilding every column (host order, hence positions, never changes here).
        """
        positions = [self.index.get(h) for h in changed]
        if any(p is None for p in positions):
            return None
        cols = self.columns()
        for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS):
            cols[name] = cols[name].copy()
        objects = {name: list(cols[name]) for name in _OBJECT}
        for state, i in zip(changed.values(), positions, strict=True):
            assert i is not None
            for name, g in _NUMERIC.items():
                cols[name][i] = g(state)
            for name, b in _BOOLEAN.items():
                cols[name][i] = b(state)
            for name, o in _OBJECT.items():
                objects[name][i] = o(state)
        cols.update({name: tuple(values) for name, values in objects.items()})
        return HostTable(ids=self.ids, settings=settings or self.settings, as_of=self.as_of, _index=self._index, **cols)

    def updated(
        self,
        changed: Mapping[str, HostState],
        removed: Iterable[str] = (),
        settings: ClusterReport | None = None,
    ) -> HostTable:
        """A copy with the rows of `changed` hosts replaced or added and those of `removed` hosts
        dropped (ids it does not have are ignored; a host in both is changed).

        A new host's row goes where it keeps the ids in order, so a table sorted by id (the state
        caches' tables) stays sorted and equals `from_states` of the hosts in id order; the rows
        after it move down. Positions hold for one table only (its `index`), never across copies.
        Pending columns keep each remaining host's values; a new host has none.
        """
        index = self.index
        gone = {index[h] for h in removed if h in index and h not in changed}
        added = sorted(h for h in changed if h not in index)
        if not gone and not added:
            table = self.with_rows(changed, settings)
            assert table is not None
            return table
        settings = settings or self.settings
        n = len(self)
        fresh = HostTable.from_states(changed.values(), settings)
        # Every column is gathered from [old rows..., rows of `fresh`...] (plus one row of
        # nothing pending for the pending columns): state_rows/pending_rows say which row each
        # host of the result takes.
        fresh_row = {h: n + k for k, h in enumerate(changed)}
        kept = ((h, i) for i, h in enumerate(self.ids) if i not in gone)
        order = list(heapq.merge(kept, ((h, n) for h in added), key=lambda e: e[0]))
        state_rows = [fresh_row.get(h, i) for h, i in order]
        pending_rows = [i for _, i in order]
        state_take = np.array(state_rows, dtype=np.intp)
        pending_take = np.array(pending_rows, dtype=np.intp)
        cols: dict[str, Any] = {}
        for name in (*_NUMERIC, *_BOOLEAN):
            cols[name] = np.concatenate((getattr(self, name), getattr(fresh, name)))[state_take]
        for name in _OBJECT:
            rows = (*getattr(self, name), *getattr(fresh, name))
            cols[name] = tuple(map(rows.__getitem__, state_rows))
        for name in PENDING_COLUMNS:
            cols[name] = np.concatenate((getattr(self, name), np.zeros(1)))[pending_take]
        pending_ids = (*self.pending_vm_ids, _NOTHING)
        cols["pending_vm_ids"] = tuple(map(pending_ids.__getitem__, pending_rows))
        return HostTable(ids=tuple(h for h, _ in order), settings=settings, as_of=self.as_of, **cols)

    # ------------------------------------------------------------------ selection
    def index_of(self, host_ids: Iterable[str]) -> IndexArray:
        """Positions of `host_ids` in this table; unknown ids are skipped."""
        idx = self.index
        return np.fromiter((idx[h] for h in host_ids if h in idx), dtype=np.intp)

    def position(self, host_id: str) -> int | None:
        return self.index.get(host_id)

    def take(self, positions: IndexArray | BoolArray) -> HostTable:
        """The sub-table of the hosts at `positions` (an index array or a boolean mask)."""
        pos: IndexArray = np.flatnonzero(positions) if positions.dtype == np.bool_ else positions.astype(np.intp)
        as_list = pos.tolist()
        cols: dict[str, Any] = {name: getattr(self, name)[pos] for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS)}
        # Object columns are picked lazily: most units never read most of them.
        cols.update({name: Rows.pick(getattr(self, name), as_list) for name in OBJECT_COLUMNS})
        return HostTable(
            ids=tuple(map(self.ids.__getitem__, as_list)),
            settings=self.settings,
            as_of=self.as_of,
            _cluster=self.cluster,
            **cols,
        )

    def subset(self, host_ids: Iterable[str]) -> HostTable:
        return self.take(self.index_of(host_ids))

    def view(self, host_ids: Sequence[str], pending: Iterable[PendingEntry], *, now: float | None = None) -> HostTable:
        """What a filter or weight unit is given: these hosts, with `pending` folded into the whole
        cluster first, so `locate` also finds a VM pending on a host outside the view (affinity
        groups need where every member is)."""
        whole = self.with_pending(pending, now=now)
        if len(host_ids) == len(self) and tuple(host_ids) == self.ids:
            return whole
        return whole.subset(host_ids)

    # ------------------------------------------------------------------ derived columns
    @property
    def effective_cpus(self) -> FloatArray:
        """Host CPUs as the cluster counts them: threads when it counts threads as cores."""
        if self.settings.count_threads_as_cores:
            return np.where(self.cpu_threads > 0, self.cpu_threads, self.cpu_cores)
        return self.cpu_cores

    def has_network(self, network: str) -> BoolArray:
        return np.fromiter((network in n for n in self.networks), dtype=np.bool_, count=len(self))

    @property
    def cluster(self) -> HostTable:
        """The table of the whole cluster (pending folded in), of which this one is a part."""
        return self._cluster if self._cluster is not None else self

    def locate(self, vm_ids: Iterable[str]) -> dict[str, str]:
        """Where in the whole cluster these VMs run or are pending: {vm id: host id}."""
        wanted = frozenset(vm_ids)
        root = self.cluster
        found: dict[str, str] = {}
        for host, running, pending in zip(root.ids, root.vm_ids, root.pending_vm_ids, strict=True):
            for vm in wanted & (running | pending):
                found[vm] = host
        return found

    def vms_on(self, i: int) -> frozenset[str]:
        """VMs on host i: running there, or placed there and pending."""
        return self.vm_ids[i] | self.pending_vm_ids[i]

    def group_metadata(self, i: int) -> list[Mapping[str, str]]:
        """Metadata of the host groups (aggregates) host i belongs to, in group-id order."""
        groups = self.settings.host_groups
        return [groups[g] for g in sorted(self.host_groups[i]) if g in groups]


__all__ = [
    "BOOLEAN_COLUMNS",
    "NUMERIC_COLUMNS",
    "OBJECT_COLUMNS",
    "PENDING_COLUMNS",
    "BoolArray",
    "CpuSamples",
    "FloatArray",
    "HostTable",
    "IndexArray",
]

# Keep the declarations honest: every dataclass column is in exactly one group.
_declared = {f for f in HostTable.__dataclass_fields__ if f not in ("ids", "settings", "as_of", "_index", "_cluster")}
assert _declared == {*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS, *OBJECT_COLUMNS}, _declared ^ {
    *NUMERIC_COLUMNS,
    *BOOLEAN_COLUMNS,
    *OBJECT_COLUMNS,
}
