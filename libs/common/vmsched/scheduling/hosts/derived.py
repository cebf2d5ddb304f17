"""What a table derives from its columns and keeps for its next versions.

A decision at 10,000 hosts must not cost a pass over every host in Python, and most of what the
units derive per host (a host's CPU count, whether it offers network n, where each VM runs)
changes with a host or two from one version of the table to the next. Each entry kept here
names what it was computed from (the very objects, compared by identity) and is used only by a
table that still holds them: versions that keep a column (`with_pending`, `with_rows`) keep
what was derived from it, and a changed column's factors and VM index are brought up to date
with its changed rows instead of rebuilt.

A table owns one TableCache (a field, made with the table), which holds its own positions and
pending rows and a DerivedValues shared with the versions made from it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

from vmsched.scheduling.hosts.arrays import BoolArray, FloatArray, IndexArray
from vmsched.scheduling.hosts.columns import SHARED

if TYPE_CHECKING:
    from vmsched.scheduling.hosts.table import HostTable

A = TypeVar("A", bound=npt.NDArray[Any])


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


class VmIndex:
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
    def of(cls, vm_ids: Sequence[frozenset[str]]) -> VmIndex:
        base = {v: i for i, ids in enumerate(vm_ids) for v in ids}
        multi: dict[str, tuple[int, ...]] = {}
        if len(base) != sum(map(len, vm_ids)):  # some VM on two hosts: all its rows
            for i, ids in enumerate(vm_ids):
                for v in ids:
                    multi[v] = (*multi.get(v, ()), i)
            multi = {v: rows for v, rows in multi.items() if len(rows) > 1}
        return cls(vm_ids, base, multi, frozenset())

    def extended(self, vm_ids: Sequence[frozenset[str]], rows: Iterable[int], limit: int) -> VmIndex | None:
        """The index of `vm_ids`, this column with `rows` changed (None: rebuild instead)."""
        fresh = self.fresh.union(rows)
        return VmIndex(vm_ids, self.base, self.multi, fresh) if len(fresh) <= limit else None

    def rows(self, vm: str) -> set[int]:
        vm_ids = self.source
        at = self.multi.get(vm)
        if at is None:
            row = self.base.get(vm)
            at = () if row is None else (row,)
        found = {r for r in at if vm in vm_ids[r]}
        found.update(r for r in self.fresh if vm in vm_ids[r])
        return found


class DerivedValues:
    """What tables derived from their columns (per-host arrays by key, factors of shared columns,
    where VMs run), shared by the versions of a table that keep those columns."""

    __slots__ = ("arrays", "factors", "ids", "vm_index", "zero_pending")

    def __init__(self) -> None:
        #: key -> (the settings and columns it was computed from, the per-host array)
        self.arrays: dict[str, tuple[tuple[Any, ...], npt.NDArray[Any]]] = {}
        self.factors: dict[str, Factors] = {}
        self.vm_index: VmIndex | None = None
        #: Pending columns (the arrays) known to be all zero.
        self.zero_pending: tuple[Any, ...] | None = None
        #: (ids, the same as an array of objects), to take sub-tables' ids by array indexing.
        self.ids: tuple[Sequence[str], npt.NDArray[np.object_]] | None = None

    def carried(
        self,
        cols: Mapping[str, Any],
        positions: list[int],
        replaced: Mapping[str, tuple[Sequence[Any], list[Any]]],
    ) -> DerivedValues:
        """What a version with columns `cols` keeps of these, the object columns of `replaced`
        (name -> (column before, values at `positions`)) changed at `positions`: what was derived
        from a changed column is brought up to date, from the others kept."""
        out = DerivedValues()
        # Each entry checks its source column: the kept columns' entries stay valid.
        out.factors = dict(self.factors)
        for name, (old, values) in replaced.items():
            factors = self.factors.get(name)
            if factors is not None and factors.source is old:
                out.factors[name] = factors.with_rows(cols[name], positions, values)
            index = self.vm_index
            if name == "vm_ids" and index is not None and index.source is old:
                out.vm_index = index.extended(cols[name], positions, max(64, len(old) // 16))
        out.ids = self.ids
        out.arrays = dict(self.arrays)
        out.zero_pending = self.zero_pending
        if "vm_ids" not in replaced:
            out.vm_index = self.vm_index
        return out


class TableCache:
    """What one table computed from its columns and keeps for its later reads: its host ids'
    positions, its rows with a VM pending (each with the column it was computed from), a
    sub-table's array columns taken from its parent so far, and the DerivedValues it shares with
    its versions."""

    __slots__ = ("derived", "index", "pending_rows", "taken")

    def __init__(
        self,
        derived: DerivedValues | None = None,
        index: tuple[Sequence[str], dict[str, int]] | None = None,
        pending_rows: tuple[Sequence[frozenset[str]], tuple[int, ...]] | None = None,
        taken: dict[str, npt.NDArray[Any]] | None = None,
    ) -> None:
        self.derived = derived if derived is not None else DerivedValues()
        #: A sub-table's array columns by name, taken from its parent when first read (views.py).
        self.taken: dict[str, npt.NDArray[Any]] = taken if taken is not None else {}
        #: (ids, host id -> position); built on first lookup (most sub-tables are never searched by id).
        self.index = index
        #: (pending_vm_ids, the rows where it holds a VM)
        self.pending_rows = pending_rows

    def positions(self, ids: Sequence[str]) -> dict[str, int]:
        """host id -> position in `ids`."""
        known = self.index
        if known is None or known[0] is not ids:
            known = self.index = (ids, {h: i for i, h in enumerate(ids)})
        return known[1]

    def indexed(self, ids: Sequence[str]) -> bool:
        """Whether the positions of `ids` are made already."""
        return self.index is not None and self.index[0] is ids

    def rows_pending(self, pending_vm_ids: Sequence[frozenset[str]]) -> tuple[int, ...]:
        """Positions of the hosts with a VM pending in `pending_vm_ids`, ascending."""
        known = self.pending_rows
        if known is None or known[0] is not pending_vm_ids:
            known = self.pending_rows = (pending_vm_ids, tuple(i for i, ids in enumerate(pending_vm_ids) if ids))
        return known[1]


def derived(table: HostTable, key: str, columns: tuple[str, ...], make: Callable[[HostTable], A]) -> A:
    """HostTable.derived: `make(table)`, a per-host array computed row by row from the settings and
    `columns` only, kept for the next versions of the table while those are the same objects (a
    host's CPU count or SPM share rarely changes; computing them in every unit of every decision
    cost more than the units' own work). A sub-table of known rows takes its cluster's."""
    rows = table._rows
    if rows is not None:
        # A sub-table's rows are the cluster's positions (views.take checked them): "clip" skips
        # the bounds checks that made this take several times slower.
        return cast(A, table.cluster.derived(key, columns, make).take(rows, mode="clip"))
    sources = (table.settings, *(getattr(table, c) for c in columns))
    arrays = table._cache.derived.arrays
    known = arrays.get(key)
    if known is not None and len(known[0]) == len(sources) and all(map(operator.is_, known[0], sources)):
        return cast(A, known[1])
    value = make(table)
    value.flags.writeable = False  # shared by the versions that keep it
    arrays[key] = (sources, value)
    return value


def factors(table: HostTable, name: str) -> Factors:
    """HostTable.factors: the factors of object column `name` (one of the shared columns: networks,
    arch, hypervisor_type, cpu_models, emulated_machines, host_groups), kept for the next versions."""
    if name not in SHARED:
        raise ValueError(f"no factors of column {name!r}: only of {sorted(SHARED)}")
    column = getattr(table, name)
    kept = table._cache.derived.factors
    found = kept.get(name)
    if found is not None and found.source is column:
        return found
    if table._rows is not None:
        # A sub-table's values are the cluster's at its rows.
        whole = table.cluster.factors(name)
        found = Factors(column, whole.codes.take(table._rows, mode="clip"), whole.values, whole.lookup)
    else:
        found = Factors.of(column)
    kept[name] = found
    return found


def offering(table: HostTable, name: str, value: str) -> BoolArray:
    """True at the hosts whose set in shared column `name` holds `value`: one test per distinct set."""
    f = table.factors(name)
    found = np.fromiter((value in v for v in f.values), dtype=np.bool_, count=len(f.values))
    out: BoolArray = found[f.codes]
    return out


def id_array(table: HostTable) -> npt.NDArray[np.object_]:
    """The table's ids as an array of the same str objects (to take sub-tables' ids by indexing)."""
    store = table._cache.derived
    known = store.ids
    if known is None or known[0] is not table.ids:
        known = store.ids = (table.ids, np.array(table.ids, dtype=object))
    return known[1]


def where(table: HostTable, vm_ids: frozenset[str]) -> dict[str, set[int]]:
    """The rows where each of `vm_ids` runs or is pending (VMs found nowhere are left out)."""
    store = table._cache.derived
    index = store.vm_index
    if index is None or index.source is not table.vm_ids:
        index = store.vm_index = VmIndex.of(table.vm_ids)
    pending, pending_rows = table.pending_vm_ids, table.pending_rows()
    found: dict[str, set[int]] = {}
    for vm in vm_ids:
        rows = index.rows(vm)
        rows.update(r for r in pending_rows if vm in pending[r])
        if rows:
            found[vm] = rows
    return found


def members_on(table: HostTable, vm_ids: Iterable[str]) -> FloatArray:
    """HostTable.members_on: how many of `vm_ids` run or are pending on each host."""
    members = frozenset(vm_ids)
    root = table.cluster
    if root is not table and table._rows is None:  # a sub-table that does not know its rows
        running, pending = table.vm_ids, table.pending_vm_ids
        n = len(table)
        return np.fromiter((len(members & (running[i] | pending[i])) for i in range(n)), dtype=np.float64, count=n)
    counts = np.zeros(len(root), dtype=np.float64)
    for rows in where(root, members).values():
        counts[list(rows)] += 1.0
    return counts if table._rows is None else counts.take(table._rows, mode="clip")


def locate(table: HostTable, vm_ids: Iterable[str]) -> dict[str, str]:
    """HostTable.locate: {vm id: host id} in the whole cluster (a VM on two hosts, mid-move, is
    named at the later in table order)."""
    root = table.cluster
    found = where(root, frozenset(vm_ids))
    return {vm: root.ids[max(rows)] for vm, rows in sorted(found.items(), key=lambda e: (min(e[1]), e[0]))}


__all__ = [
    "DerivedValues",
    "Factors",
    "TableCache",
    "VmIndex",
    "derived",
    "factors",
    "id_array",
    "locate",
    "members_on",
    "offering",
    "where",
]
