"""A table's columns: which there are, how each is read from a HostState, and how a table's
columns are built from states or changed at a few rows.

Columns come in three groups, declared once below: numeric (float arrays), boolean arrays, and
per-host Python objects (sets, mappings) that no array can hold. Adding a host attribute means
adding it to one group (NUMERIC, BOOLEAN or OBJECT) and to HostTable's fields.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, overload

import numpy as np

from vmsched.contracts import HostState, HostStatus
from vmsched.scheduling.hosts.sequences import Patched

#: The empty set every host without such values holds (one object, not one per host).
NOTHING: frozenset[str] = frozenset()
#: What a host without any entries in a map column holds: one object for every such host (an
#: empty dict per host per column is 2.5 MB at 10,000 hosts), and read-only, as it is shared.
_NO_ENTRIES: Mapping[Any, Any] = MappingProxyType({})


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


#: What every host without samples holds (one object, never written).
_NO_SAMPLES = CpuSamples()


def _samples(pairs: Sequence[tuple[float, float]]) -> CpuSamples:
    return CpuSamples(pairs) if pairs else _NO_SAMPLES


def _ts(value: Any) -> float:
    return value.timestamp() if value is not None else math.nan


def _set(values: Iterable[str]) -> frozenset[str]:
    return frozenset(values) or NOTHING


def _map(values: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return values or _NO_ENTRIES


def same(old: Any, new: Any) -> bool:
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
NUMERIC: Mapping[str, Callable[[HostState], float]] = MappingProxyType(
    {
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
)
_NUMERIC_NAMES: tuple[str, ...] = tuple(NUMERIC)
_NUMERIC_GETTERS: tuple[Callable[[HostState], float], ...] = tuple(NUMERIC.values())
BOOLEAN: Mapping[str, Callable[[HostState], bool]] = MappingProxyType(
    {
        "up": lambda h: h.report.status is HostStatus.UP,
        "is_spm": lambda h: h.report.is_spm,
        "enabled": lambda h: h.report.enabled,
    }
)
OBJECT: Mapping[str, Callable[[HostState], Any]] = MappingProxyType(
    {
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
)
#: Object columns whose values are immutable and mostly the same on many hosts (every host on the
#: same networks, of one architecture): `build` keeps one object per distinct value.
SHARED: frozenset[str] = frozenset(
    {"networks", "arch", "hypervisor_type", "cpu_models", "emulated_machines", "host_groups"}
)
#: Filled by HostTable.with_pending, zero in a table straight from the state.
PENDING_COLUMNS: tuple[str, ...] = ("pending_mem_mb", "pending_vcpus", "pending_cpus_pinned", "pending_vm_count")
NUMERIC_COLUMNS: tuple[str, ...] = (*NUMERIC, *PENDING_COLUMNS)
BOOLEAN_COLUMNS: tuple[str, ...] = tuple(BOOLEAN)
OBJECT_COLUMNS: tuple[str, ...] = (*OBJECT, "pending_vm_ids")
ARRAY_COLUMNS: frozenset[str] = frozenset((*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS))


def build(hosts: Iterable[HostState]) -> tuple[list[str], dict[str, Any]]:
    """The ids and every column of `hosts`, in their order, nothing pending.

    `hosts` is read once and no state is kept: fed a generator that parses stored records one
    at a time (as StateCache does), the columns are built with one parsed model alive at a time.
    """
    numeric = _NUMERIC_GETTERS
    boolean = tuple(BOOLEAN.values())
    objects = tuple(OBJECT.values())
    ids: list[str] = []
    # Rows go straight into flat arrays of C numbers: no float object per value on the way.
    numbers = array("d")
    flags = array("b")
    values: tuple[list[Any], ...] = tuple([] for _ in objects)
    distinct: tuple[dict[Any, Any] | None, ...] = tuple({} if name in SHARED else None for name in OBJECT)
    for h in hosts:
        ids.append(h.report.host_id)
        numbers.extend([g(h) for g in numeric])
        flags.extend([g(h) for g in boolean])
        for column, g, seen in zip(values, objects, distinct, strict=True):
            value = g(h)
            column.append(value if seen is None else seen.setdefault(value, value))
    n = len(ids)
    block = np.frombuffer(numbers, dtype=np.float64).reshape(n, len(numeric))
    cols: dict[str, Any] = {name: np.array(block[:, j]) for j, name in enumerate(NUMERIC)}
    zeros = np.zeros(n, dtype=np.float64)
    cols.update({name: zeros for name in PENDING_COLUMNS})
    bits = np.frombuffer(flags, dtype=np.int8).reshape(n, len(boolean))
    cols.update({name: bits[:, j] != 0 for j, name in enumerate(BOOLEAN)})
    cols.update({name: tuple(column) for name, column in zip(OBJECT, values, strict=True)})
    cols["pending_vm_ids"] = (NOTHING,) * n
    return ids, cols


def change_arrays(cols: dict[str, Any], positions: list[int], states: list[HostState]) -> None:
    """Replace in `cols` the numeric and boolean columns whose `positions` change to `states`'
    values (copies; the others stay shared)."""
    rows = np.array(positions, dtype=np.intp)
    numbers = [cols[name] for name in NUMERIC]
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
        checked: tuple[tuple[str, Callable[[HostState], Any]], ...] = tuple(BOOLEAN.items())
    else:
        checked = (*NUMERIC.items(), *BOOLEAN.items())
    for name, g in checked:
        old_col = cols[name]
        values = np.array([g(state) for state in states], dtype=old_col.dtype)
        if old_col[rows].tobytes() != values.tobytes():
            col = old_col.copy()
            col[rows] = values
            cols[name] = col


def change_objects(
    cols: dict[str, Any], positions: list[int], states: list[HostState]
) -> dict[str, tuple[Sequence[Any], list[Any]]]:
    """Replace in `cols` the object columns whose `positions` change to `states`' values; returns
    the replaced ones, name -> (the column before, the values at `positions`)."""
    replaced: dict[str, tuple[Sequence[Any], list[Any]]] = {}
    for name, o in OBJECT.items():
        old = cols[name]
        values = [o(state) for state in states]
        if all(same(old[i], v) for i, v in zip(positions, values, strict=True)):
            continue
        cols[name] = Patched.of(old, dict(zip(positions, values, strict=True)))
        replaced[name] = (old, values)
    return replaced


__all__ = [
    "ARRAY_COLUMNS",
    "BOOLEAN",
    "BOOLEAN_COLUMNS",
    "NOTHING",
    "NUMERIC",
    "NUMERIC_COLUMNS",
    "OBJECT",
    "OBJECT_COLUMNS",
    "PENDING_COLUMNS",
    "SHARED",
    "CpuSamples",
    "build",
    "change_arrays",
    "change_objects",
    "same",
]
