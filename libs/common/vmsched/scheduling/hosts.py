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

A table is immutable, and a decision at 10,000 hosts must not cost a pass over every host in
Python: copies share what did not change (`with_rows` copies only the columns whose changed rows
differ, `with_pending` with nothing pending copies nothing), and a table keeps what it derived from
its object columns for the next version (`factors`: the distinct values of a shared column, so
"which hosts have network n" is one test per distinct network set; where each VM runs, for
affinity). Sub-tables (`take`) know their rows in the whole cluster and read those from it.
"""

from __future__ import annotations

import heapq
import math
import operator
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

import numpy as np
import numpy.typing as npt

from vmsched.contracts import ClusterReport, HostState, HostStatus, PendingEntry

T = TypeVar("T")
A = TypeVar("A", bound=npt.NDArray[Any])
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]


_NOTHING: frozenset[str] = frozenset()


class Positions:
    """Row positions as an array, and as a list of ints when first read one by one (a list of
    10,000 ints costs more than most units that read a sub-table)."""

    __slots__ = ("_list", "array")

    def __init__(self, array: IndexArray) -> None:
        self.array = array
        self._list: list[int] | None = None

    @property
    def list(self) -> list[int]:
        if self._list is None:
            self._list = self.array.tolist()
        return self._list

    def __len__(self) -> int:
        return len(self.array)


class Rows(Sequence[T]):
    """The items of a column at some positions, looked up when read (a sub-table's object column).

    Copying every per-host object column on every sub-table cost more than the units that read
    them; a Rows holds the parent column and the positions, and becomes a tuple on first iteration.
    """

    __slots__ = ("_base", "_items", "_rows")

    def __init__(self, base: Sequence[T], rows: Positions) -> None:
        self._base, self._rows = base, rows
        self._items: tuple[T, ...] | None = None

    @classmethod
    def pick(cls, column: Sequence[T], rows: Positions) -> Sequence[T]:
        if isinstance(column, Rows):  # compose, so reads never go through a chain of views
            if column._items is not None:
                return cls(column._items, rows)
            return cls(column._base, Positions(column._rows.array[rows.array]))
        return cls(column, rows)

    def _tuple(self) -> tuple[T, ...]:
        if self._items is None:
            base = self._base._tuple() if isinstance(self._base, Patched) else self._base
            self._items = tuple(map(base.__getitem__, self._rows.list))
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
        return self._base[self._rows.list[i]]

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


class Patched(Sequence[T]):
    """An object column as an earlier version's tuple and the rows changed since: a version of a
    10,000-host column per decision without copying the 10,000 (a simulation changes a host or
    two between decisions). Reads by position look at the changes first; a walk over the whole
    column makes it a tuple once. `with_rows` flattens it when the changes pile up."""

    __slots__ = ("_base", "_changes", "_items")

    def __init__(self, base: tuple[T, ...], changes: Mapping[int, T]) -> None:
        self._base, self._changes = base, changes
        self._items: tuple[T, ...] | None = None

    @classmethod
    def of(cls, column: Sequence[T], changes: Mapping[int, T]) -> Sequence[T]:
        """`column` with `changes`, flattened when they pile up."""
        if isinstance(column, Patched):
            base, changes = column._base, {**column._changes, **changes}
        else:
            base = column if isinstance(column, tuple) else tuple(column)
        if len(changes) > _MAX_PATCHED:
            listed = list(base)
            for i, v in changes.items():
                listed[i] = v
            return tuple(listed)
        return cls(base, changes)

    def _tuple(self) -> tuple[T, ...]:
        if self._items is None:
            listed = list(self._base)
            for i, v in self._changes.items():
                listed[i] = v
            self._items = tuple(listed)
        return self._items

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice) or self._items is not None:
            return self._tuple()[i]
        if i < 0:
            i += len(self._base)
        changed = self._changes.get(i, _UNCHANGED)
        return self._base[i] if changed is _UNCHANGED else changed

    def __len__(self) -> int:
        return len(self._base)

    def __iter__(self) -> Iterator[T]:
        return iter(self._tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._tuple() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return f"Patched({self._tuple()!r})"


#: Changed rows a Patched column holds before a new version is a plain tuple again.
_MAX_PATCHED = 64
_UNCHANGED: Any = object()


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


class SortedIds(tuple[str, ...]):
    """Host ids in strictly ascending order: a table's ids when they are (the state caches keep
    their tables sorted by id), kept so through its sub-tables, so a selector breaks ties by id
    with a stable sort instead of comparing 10,000 strings on every decision."""

    __slots__ = ()


class TakenIds(Sequence[str]):
    """A sub-table's host ids: the cluster's (an array of the same str objects) at its rows, looked
    up when read. Most sub-tables' ids are never read whole (a decision reads its best few), and
    a tuple of 10,000 ids cost more to make and to free than the units reading the sub-table."""

    __slots__ = ("_array", "_items", "_rows", "ascending")

    def __init__(self, array: npt.NDArray[np.object_], rows: IndexArray, ascending: bool) -> None:
        self._array, self._rows = array, rows
        #: Whether the ids ascend (they do when the cluster's do, rows ascending).
        self.ascending = ascending
        self._items: tuple[str, ...] | None = None

    def _tuple(self) -> tuple[str, ...]:
        if self._items is None:
            self._items = tuple(self._array[self._rows].tolist())
        return self._items

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice) or self._items is not None:
            return self._tuple()[i]
        found: str = self._array[self._rows[i]]
        return found

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._tuple() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return f"TakenIds({self._tuple()!r})"


def ids_ascend(ids: Sequence[str]) -> bool:
    """Whether `ids` are known to ascend strictly, without comparing them (False: not known)."""
    return isinstance(ids, SortedIds) or (isinstance(ids, TakenIds) and ids.ascending)


def constant(n: int, value: float) -> FloatArray:
    """`value` for each of n hosts, as a read-only array that stores it once: what a unit with
    nothing to say about a VM returns, which a selector tells apart without reading n values."""
    one = _ONE.get(value)
    if one is None:
        if len(_ONE) >= 256:
            _ONE.clear()
        one = _ONE[value] = np.full(1, value, dtype=np.float64)
    out: FloatArray = np.ndarray((n,), dtype=np.float64, buffer=one, strides=(0,))
    out.flags.writeable = False
    return out


#: value -> the one-element array `constant` arrays of it look at (never written).
_ONE: dict[float, FloatArray] = {}


def is_constant(values: npt.NDArray[Any]) -> bool:
    """Whether `values` is a `constant` array (one value stored once)."""
    return values.ndim == 1 and values.strides == (0,) and len(values) > 0


def _ids(ids: Iterable[str]) -> tuple[str, ...]:
    """`ids` as a tuple, a SortedIds when they ascend."""
    out = tuple(ids)
    return SortedIds(out) if all(a < b for a, b in pairwise(out)) else out


@dataclass(frozen=True, eq=False)
class Factors:
    """An object column as codes into its distinct values: column[i] == values[codes[i]]."""

    #: The column these are the factors of (held, so the identity test stays sound).
    source: Sequence[Any]
    codes: IndexArray
    values: tuple[Any, ...]
    #: value -> its code
    lookup: Mapping[Any, int]

    @classmethod
    def of(cls, column: Sequence[Any]) -> Factors:
        lookup: dict[Any, int] = {}
        codes = np.fromiter((lookup.setdefault(v, len(lookup)) for v in column), dtype=np.intp, count=len(column))
        return cls(column, codes, tuple(lookup), lookup)

    def with_rows(self, column: Sequence[Any], rows: Sequence[int], values: Sequence[Any]) -> Factors:
        """The factors of `column`, this column with the values at `rows` changed to `values`."""
        codes = self.codes.copy()
        lookup: dict[Any, int] | None = None
        for i, v in zip(rows, values, strict=True):
            k = (lookup or self.lookup).get(v)
            if k is None:
                lookup = lookup if lookup is not None else dict(self.lookup)
                k = lookup[v] = len(lookup)
            codes[i] = k
        if lookup is None:
            return Factors(column, codes, self.values, self.lookup)
        return Factors(column, codes, tuple(lookup), lookup)


class _VmIndex:
    """Where VMs run in `source` (a vm_ids column): the row of each VM in an earlier version of the
    column (`base`; `multi` for a VM counted on several hosts, mid-move), and the rows changed
    since (`fresh`). A VM runs at those of its base rows that still hold it and at the fresh rows
    that hold it (rows keep their positions from version to version: `with_rows`). Rebuilding
    costs a pass over every VM, so versions extend it until `fresh` grows too long."""

    __slots__ = ("base", "fresh", "multi", "source")

    def __init__(
        self,
        source: Sequence[frozenset[str]],
        base: Mapping[str, int],
        multi: Mapping[str, tuple[int, ...]],
        fresh: frozenset[int],
    ) -> None:
        self.source, self.base, self.multi, self.fresh = source, base, multi, fresh

    @classmethod
    def of(cls, vm_ids: Sequence[frozenset[str]]) -> _VmIndex:
        base = {v: i for i, ids in enumerate(vm_ids) for v in ids}
        multi: dict[str, tuple[int, ...]] = {}
        if len(base) != sum(map(len, vm_ids)):  # some VM on two hosts: all its rows
            for i, ids in enumerate(vm_ids):
                for v in ids:
                    multi[v] = (*multi.get(v, ()), i)
            multi = {v: rows for v, rows in multi.items() if len(rows) > 1}
        return cls(vm_ids, base, multi, frozenset())

    def extended(self, vm_ids: Sequence[frozenset[str]], rows: Iterable[int], limit: int) -> _VmIndex | None:
        """The index of `vm_ids`, this column with `rows` changed (None: rebuild instead)."""
        fresh = self.fresh.union(rows)
        return _VmIndex(vm_ids, self.base, self.multi, fresh) if len(fresh) <= limit else None

    def rows(self, vm: str) -> set[int]:
        vm_ids = self.source
        at = self.multi.get(vm)
        if at is None:
            row = self.base.get(vm)
            at = () if row is None else (row,)
        found = {r for r in at if vm in vm_ids[r]}
        found.update(r for r in self.fresh if vm in vm_ids[r])
        return found


class _Memo:
    """What tables derived from their object columns (factors of shared columns, where VMs run),
    each entry valid for the table whose column is its `source` (the same object): versions that
    keep a column (`with_pending`, `with_rows`) keep what was derived from it."""

    __slots__ = ("derived", "factors", "ids", "vm_index", "zero_pending")

    def __init__(self, factors: dict[str, Factors] | None = None, vm_index: _VmIndex | None = None) -> None:
        self.factors: dict[str, Factors] = factors if factors is not None else {}
        self.vm_index = vm_index
        #: key -> (the settings and columns it was computed from, the per-host array)
        self.derived: dict[str, tuple[tuple[Any, ...], npt.NDArray[Any]]] = {}
        #: Pending columns (the arrays) known to be all zero.
        self.zero_pending: tuple[Any, ...] | None = None
        #: (ids, the same as an array of objects), to take sub-tables' ids by array indexing.
        self.ids: tuple[Sequence[str], npt.NDArray[np.object_]] | None = None


def _same(old: Any, new: Any) -> bool:
    """Whether a changed row's object value can stay as it was: the same object, or an equal set,
    string or CPU history (bit for bit; mappings only when the same object)."""
    if old is new:
        return True
    kind = type(old)
    if kind is not type(new):
        return False
    if kind is frozenset or kind is str:
        return bool(old == new)
    if kind is CpuSamples:
        return bool(old.times.tobytes() == new.times.tobytes() and old.loads.tobytes() == new.loads.tobytes())
    return False


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
    "cpu_last_sample_at": lambda h: h.cpu_samples[-1][0] if h.cpu_samples else math.nan,
    "cpu_sample_count": lambda h: len(h.cpu_samples),
}
_NUMERIC_NAMES: tuple[str, ...] = tuple(_NUMERIC)
_NUMERIC_GETTERS: tuple[Callable[[HostState], float], ...] = tuple(_NUMERIC.values())
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
_ARRAY_COLUMNS: frozenset[str] = frozenset((*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS))


@dataclass(frozen=True, eq=False)
class HostTable:
    """Hosts of one cluster, one array per attribute, all aligned with `ids`."""

    #: A tuple (a SortedIds when they ascend) for a whole cluster, a TakenIds for a sub-table.
    ids: Sequence[str]
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
    #: When the newest CPU sample was taken (NaN without samples), and how many the host has: a
    #: host with one sample has been over (or under) a threshold since that sample, no walk needed.
    cpu_last_sample_at: FloatArray
    cpu_sample_count: FloatArray
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
    #: A sub-table's rows in `cluster`, ascending (None: the whole cluster, or not known).
    _rows: IndexArray | None = field(default=None, repr=False)
    #: (pending_vm_ids, the rows where it holds a VM): known when the column was built.
    _pending_rows: tuple[Sequence[frozenset[str]], tuple[int, ...]] | None = field(default=None, repr=False)
    _memo: _Memo = field(default_factory=_Memo, repr=False)
    #: This whole-cluster table with nothing pending, when this one was made from it by folding
    #: pending in: folding none in again gives it back instead of summing zeros.
    _unpended: HostTable | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            object.__setattr__(self, "_index", {h: i for i, h in enumerate(self.ids)})
        assert self._index is not None
        return self._index

    @property
    def _root(self) -> bool:
        return self._cluster is None

    def _evolve(self, **changes: Any) -> HostTable:
        """A copy with `changes` (fields by name), as dataclasses.replace makes it, without passing
        45 fields through __init__ (twice per decision)."""
        copy = object.__new__(HostTable)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

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
        return cls(ids=_ids(ids), settings=settings, _pending_rows=(cols["pending_vm_ids"], ()), **cols)

    def with_pending(self, entries: Iterable[PendingEntry], *, now: float | None = None) -> HostTable:
        """A copy with the pending columns summed from `entries` (other hosts' entries are ignored),
        evaluated at `now` when given."""
        index = self.index
        placed = [(i, e) for e in entries if (i := index.get(e.host_id)) is not None]
        as_of = self.as_of if now is None else now
        if not placed and self._nothing_pending():
            # Nothing pending before or after (a simulation's usual decision): nothing to copy,
            # and a sub-table's columns stay its cluster's.
            return self._evolve(as_of=as_of)
        unpended = self._unpended
        if not placed and unpended is not None and self._same_state(unpended):
            return unpended._evolve(as_of=as_of)
        if not self._root:
            unpended = None
        elif self._nothing_pending():
            unpended = self
        n = len(self)
        mem, vcpus, pinned, count = (np.zeros(n, dtype=np.float64) for _ in range(4))
        # Most hosts have nothing pending: they share one empty set.
        vm_ids: list[frozenset[str]] = [_NOTHING] * n
        for i, e in placed:
            mem[i] += e.mem_mb
            vcpus[i] += e.vcpus
            pinned[i] += e.cpus_pinned
            count[i] += 1
            vm_ids[i] = vm_ids[i] | {e.vm_id}
        pending_ids = tuple(vm_ids)
        return self._evolve(
            pending_mem_mb=mem,
            pending_vcpus=vcpus,
            pending_cpus_pinned=pinned,
            pending_vm_count=count,
            pending_vm_ids=pending_ids,
            as_of=as_of,
            _index=self._index,
            # A sub-table's pending no longer is its cluster's: it reads its own rows from now on.
            _rows=None,
            _pending_rows=(pending_ids, tuple(sorted({i for i, _ in placed}))),
            _unpended=unpended,
        )

    def _same_state(self, other: HostTable) -> bool:
        """Whether `other` has this table's hosts, settings and state columns (the same objects)."""
        return all(getattr(self, name) is getattr(other, name) for name in _STATE_FIELDS)

    def _nothing_pending(self) -> bool:
        if self.pending_rows():
            return False
        columns = (self.pending_mem_mb, self.pending_vcpus, self.pending_cpus_pinned, self.pending_vm_count)
        known = self._memo.zero_pending
        if known is not None and all(map(operator.is_, known, columns)):
            return True
        if any(np.count_nonzero(c) for c in columns):
            return False
        self._memo.zero_pending = columns
        return True

    def pending_rows(self) -> tuple[int, ...]:
        """Positions of the hosts with a VM pending, ascending."""
        known = self._pending_rows
        if known is not None and known[0] is self.pending_vm_ids:
            return known[1]
        rows = tuple(i for i, ids in enumerate(self.pending_vm_ids) if ids)
        object.__setattr__(self, "_pending_rows", (self.pending_vm_ids, rows))
        return rows

    def derived(self, key: str, columns: tuple[str, ...], make: Callable[[HostTable], A]) -> A:
        """`make(self)`: a per-host array computed row by row from the settings and `columns`
        only, kept for the next versions of the table while those are the same objects (a host's
        CPU count or SPM share rarely changes; computing them in every unit of every decision
        cost more than the units' own work). A sub-table of known rows takes its cluster's."""
        if self._rows is not None:
            return cast(A, self.cluster.derived(key, columns, make).take(self._rows))
        sources = (self.settings, *(getattr(self, c) for c in columns))
        known = self._memo.derived.get(key)
        if known is not None and len(known[0]) == len(sources) and all(map(operator.is_, known[0], sources)):
            return cast(A, known[1])
        value = make(self)
        value.flags.writeable = False  # shared by the versions that keep it
        self._memo.derived[key] = (sources, value)
        return value

    def factors(self, name: str) -> Factors:
        """The factors of object column `name` (one of the shared columns: networks, arch,
        hypervisor_type, cpu_models, emulated_machines, host_groups), kept for the next versions."""
        if name not in _SHARED:
            raise ValueError(f"no factors of column {name!r}: only of {sorted(_SHARED)}")
        column = getattr(self, name)
        found = self._memo.factors.get(name)
        if found is not None and found.source is column:
            return found
        if self._rows is not None:
            # A sub-table's values are the cluster's at its rows.
            whole = self.cluster.factors(name)
            found = Factors(column, whole.codes.take(self._rows), whole.values, whole.lookup)
        else:
            found = Factors.of(column)
        self._memo.factors[name] = found
        return found

    def with_rows(self, changed: Mapping[str, HostState], settings: ClusterReport | None = None) -> HostTable | None:
        """A copy with the rows of `changed` hosts replaced, or None if one of them is new here.

        The state caches and the simulator use this to move from one version to the next in
        O(changed hosts) instead of rebuilding every column (host order, hence positions, never
        changes here): only a column whose changed rows differ is copied (a VM's arrival changes a
        host's memory, load and VMs, not its networks or CPU models), and the others, with what
        was derived from them, are shared with this table.
        """
        positions: list[int] = []
        for h in changed:
            i = self.index.get(h)
            if i is None:
                return None
            positions.append(i)
        states = list(changed.values())
        cols = self.columns()
        self._change_arrays(cols, positions, states)
        memo = self._change_objects(cols, positions, states)
        # What HostTable(...) makes, without passing 45 fields through the dataclass's __init__.
        table = object.__new__(HostTable)
        table.__dict__.update(
            ids=self.ids,
            settings=settings or self.settings,
            as_of=self.as_of,
            _cluster=None,
            _index=self._index,
            _rows=None,
            _pending_rows=self._pending_rows,
            _memo=memo,
            _unpended=None,
            **cols,
        )
        return table

    def _change_arrays(self, cols: dict[str, Any], positions: list[int], states: list[HostState]) -> None:
        """Replace in `cols` the numeric and boolean columns whose `positions` change to `states`'
        values (copies; the others stay shared)."""
        rows = np.array(positions, dtype=np.intp)
        numbers = [cols[name] for name in _NUMERIC]
        if all(c.dtype == np.float64 for c in numbers):
            # Every number of the changed rows at once, compared bit for bit (-0.0 for 0.0, or
            # another NaN, is a change too).
            new = np.array([[g(state) for g in _NUMERIC_GETTERS] for state in states], dtype=np.float64)
            old = np.array([[c.item(i) for c in numbers] for i in positions], dtype=np.float64)
            changed = np.flatnonzero((new.view(np.int64) != old.view(np.int64)).any(axis=0)).tolist()
            for j in changed:
                col = numbers[j].copy()
                col[rows] = new[:, j]
                cols[_NUMERIC_NAMES[j]] = col
            checked: tuple[tuple[str, Callable[[HostState], Any]], ...] = tuple(_BOOLEAN.items())
        else:
            checked = (*_NUMERIC.items(), *_BOOLEAN.items())
        for name, g in checked:
            old_col = cols[name]
            values = np.array([g(state) for state in states], dtype=old_col.dtype)
            if old_col[rows].tobytes() != values.tobytes():
                col = old_col.copy()
                col[rows] = values
                cols[name] = col

    def _change_objects(self, cols: dict[str, Any], positions: list[int], states: list[HostState]) -> _Memo:
        """Replace in `cols` the object columns whose `positions` change to `states`' values; what
        was derived from a changed column is brought up to date, from the others kept."""
        memo = _Memo()
        for name, o in _OBJECT.items():
            old = cols[name]
            values = [o(state) for state in states]
            if all(_same(old[i], v) for i, v in zip(positions, values, strict=True)):
                continue
            column = cols[name] = Patched.of(old, dict(zip(positions, values, strict=True)))
            factors = self._memo.factors.get(name)
            if factors is not None and factors.source is old:
                memo.factors[name] = factors.with_rows(column, positions, values)
            index = self._memo.vm_index
            if name == "vm_ids" and index is not None and index.source is old:
                memo.vm_index = index.extended(column, positions, max(64, len(self) // 16))
        # Each entry checks its source column: the kept columns' entries stay valid.
        memo.factors = {**self._memo.factors, **memo.factors}
        memo.ids = self._memo.ids
        memo.derived = dict(self._memo.derived)
        memo.zero_pending = self._memo.zero_pending
        if memo.vm_index is None and cols["vm_ids"] is self.vm_ids:
            memo.vm_index = self._memo.vm_index
        return memo

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
        return HostTable(ids=_ids(h for h, _ in order), settings=settings, as_of=self.as_of, **cols)

    # ------------------------------------------------------------------ selection
    def index_of(self, host_ids: Iterable[str]) -> IndexArray:
        """Positions of `host_ids` in this table; unknown ids are skipped."""
        if host_ids is self.ids or (isinstance(host_ids, tuple) and host_ids == self.ids):
            return np.arange(len(self), dtype=np.intp)  # every host, in order: nothing to look up
        idx = self.index
        return np.fromiter((idx[h] for h in host_ids if h in idx), dtype=np.intp)

    def position(self, host_id: str) -> int | None:
        if self._index is None and self._rows is not None:
            # A sub-table: its position among its rows in the cluster, without indexing its ids.
            p = self.cluster.position(host_id)
            if p is None:
                return None
            j = int(np.searchsorted(self._rows, p))
            return j if j < len(self._rows) and self._rows[j] == p else None
        return self.index.get(host_id)

    def _id_array(self) -> npt.NDArray[np.object_]:
        known = self._memo.ids
        if known is None or known[0] is not self.ids:
            known = self._memo.ids = (self.ids, np.array(self.ids, dtype=object))
        return known[1]

    def take(self, positions: IndexArray | BoolArray) -> HostTable:
        """The sub-table of the hosts at `positions` (an index array or a boolean mask).

        Its array columns are taken from this table when first read (most units read a few of
        the 31) and its object columns read through to the cluster's."""
        mask = positions.dtype == np.bool_
        pos: IndexArray = np.flatnonzero(positions) if mask else positions.astype(np.intp)
        ascending = mask or bool(np.all(pos[1:] > pos[:-1]))
        cluster = self.cluster
        rows: IndexArray | None = None
        if ascending and (self._root or self._rows is not None):
            rows = pos if self._rows is None else self._rows.take(pos)
        if rows is not None:
            # The cluster's rows: read from the cluster, never through a chain of views.
            at_rows = Positions(rows)
            objects: dict[str, Sequence[Any]] = {name: Rows(getattr(cluster, name), at_rows) for name in OBJECT_COLUMNS}
            ids = TakenIds(cluster._id_array(), rows, ascending and ids_ascend(cluster.ids))
            lazy: tuple[HostTable, IndexArray] = (cluster, rows)
        else:
            at_pos = Positions(pos)
            objects = {name: Rows.pick(getattr(self, name), at_pos) for name in OBJECT_COLUMNS}
            ids = TakenIds(self._id_array(), pos, ascending and ids_ascend(self.ids))
            lazy = (self, pos)
        table = object.__new__(HostTable)
        table.__dict__.update(
            ids=ids,
            settings=self.settings,
            as_of=self.as_of,
            _cluster=cluster,
            _index=None,
            _rows=rows,
            _pending_rows=None,
            _memo=_Memo(),
            _unpended=None,
            _lazy=lazy,
            **objects,
        )
        return table

    if not TYPE_CHECKING:  # for the type checker a HostTable has its fields and nothing else

        def __getattr__(self, name: str) -> Any:
            """An array column of a sub-table, taken from its parent when first read."""
            lazy = self.__dict__.get("_lazy")
            if lazy is None or name not in _ARRAY_COLUMNS:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            parent, rows = lazy
            value = getattr(parent, name).take(rows)  # faster than indexing with positions or a mask
            self.__dict__[name] = value
            return value

    def subset(self, host_ids: Iterable[str]) -> HostTable:
        if isinstance(host_ids, TakenIds) and host_ids._array is self._id_array():
            # A sub-table's ids of this very table (the candidates when some host is down): its
            # rows are known, no id is looked up.
            return self.take(host_ids._rows)
        return self.take(self.index_of(host_ids))

    def view(self, host_ids: Sequence[str], pending: Iterable[PendingEntry], *, now: float | None = None) -> HostTable:
        """What a filter or weight unit is given: these hosts, with `pending` folded into the whole
        cluster first, so `locate` also finds a VM pending on a host outside the view (affinity
        groups need where every member is)."""
        whole = self.with_pending(pending, now=now)
        if host_ids is self.ids or (len(host_ids) == len(self) and tuple(host_ids) == self.ids):
            return whole
        return whole.subset(host_ids)

    # ------------------------------------------------------------------ derived columns
    @property
    def effective_cpus(self) -> FloatArray:
        """Host CPUs as the cluster counts them: threads when it counts threads as cores."""
        if self.settings.count_threads_as_cores:
            return self.derived(
                "effective_cpus",
                ("cpu_threads", "cpu_cores"),
                lambda t: np.where(t.cpu_threads > 0, t.cpu_threads, t.cpu_cores),
            )
        return self.cpu_cores

    def has_network(self, network: str) -> BoolArray:
        return self.offering("networks", network)

    def offering(self, name: str, value: str) -> BoolArray:
        """True at the hosts whose set in shared column `name` (networks, cpu_models, ...) holds
        `value`: one test per distinct set, not per host."""
        f = self.factors(name)
        found = np.fromiter((value in v for v in f.values), dtype=np.bool_, count=len(f.values))
        out: BoolArray = found[f.codes]
        return out

    @property
    def cluster(self) -> HostTable:
        """The table of the whole cluster (pending folded in), of which this one is a part."""
        return self._cluster if self._cluster is not None else self

    def _where(self, vm_ids: frozenset[str]) -> dict[str, set[int]]:
        """The rows where each of `vm_ids` runs or is pending (VMs found nowhere are left out)."""
        index = self._memo.vm_index
        if index is None or index.source is not self.vm_ids:
            index = self._memo.vm_index = _VmIndex.of(self.vm_ids)
        pending, pending_rows = self.pending_vm_ids, self.pending_rows()
        found: dict[str, set[int]] = {}
        for vm in vm_ids:
            rows = index.rows(vm)
            rows.update(r for r in pending_rows if vm in pending[r])
            if rows:
                found[vm] = rows
        return found

    def holding(self, vm_ids: Iterable[str]) -> BoolArray:
        """True at the hosts where one of `vm_ids` runs or is pending."""
        out: BoolArray = self.members_on(vm_ids) > 0
        return out

    def members_on(self, vm_ids: Iterable[str]) -> FloatArray:
        """How many of `vm_ids` run or are pending on each host (a VM counts once per host)."""
        members = frozenset(vm_ids)
        root = self.cluster
        if root is not self and self._rows is None:  # a sub-table that does not know its rows
            running, pending = self.vm_ids, self.pending_vm_ids
            return np.fromiter(
                (len(members & (running[i] | pending[i])) for i in range(len(self))), dtype=np.float64, count=len(self)
            )
        counts = np.zeros(len(root), dtype=np.float64)
        for rows in root._where(members).values():
            counts[list(rows)] += 1.0
        return counts if self._rows is None else counts.take(self._rows)

    def mask_of(self, host_ids: Iterable[str]) -> BoolArray:
        """True at the hosts of `host_ids` (ids this table does not have are ignored)."""
        mask = np.zeros(len(self), dtype=np.bool_)
        for h in host_ids:
            i = self.position(h)
            if i is not None:
                mask[i] = True
        return mask

    def locate(self, vm_ids: Iterable[str]) -> dict[str, str]:
        """Where in the whole cluster these VMs run or are pending: {vm id: host id} (a VM on two
        hosts, mid-move, is named at the later in table order)."""
        root = self.cluster
        found = root._where(frozenset(vm_ids))
        return {vm: root.ids[max(rows)] for vm, rows in sorted(found.items(), key=lambda e: (min(e[1]), e[0]))}

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
    "Factors",
    "FloatArray",
    "HostTable",
    "IndexArray",
    "Patched",
    "SortedIds",
    "TakenIds",
    "constant",
    "ids_ascend",
    "is_constant",
]

# Keep the declarations honest: every dataclass column is in exactly one group.
_PRIVATE = ("ids", "settings", "as_of", "_index", "_cluster", "_rows", "_pending_rows", "_memo", "_unpended")
#: What a table is of, but for what is pending and the instant.
_STATE_FIELDS: tuple[str, ...] = (
    "ids",
    "settings",
    "_cluster",
    *(
        c
        for c in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS, *OBJECT_COLUMNS)
        if c not in (*PENDING_COLUMNS, "pending_vm_ids")
    ),
)
_declared = {f for f in HostTable.__dataclass_fields__ if f not in _PRIVATE}
assert _declared == {*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS, *OBJECT_COLUMNS}, _declared ^ {
    *NUMERIC_COLUMNS,
    *BOOLEAN_COLUMNS,
    *OBJECT_COLUMNS,
}
