"""HostTable: a cluster's hosts as columns, one array (or tuple) per attribute aligned with `ids`.

A table is immutable. Its versions share what did not change (`with_rows` copies only the columns
whose changed rows differ, `with_pending` with nothing pending copies nothing), and what a table
derives from its columns it keeps in its cache (a TableCache, made with it) for its next versions.
The rooms beside this one do the work: views.py the sub-tables, pending.py the folding of pending
resources, derived.py the derived values, columns.py the columns' declarations and values.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vmsched.contracts import ClusterReport, HostState, PendingEntry
from vmsched.scheduling.hosts import derived as _derived
from vmsched.scheduling.hosts import pending as _pending
from vmsched.scheduling.hosts import views as _views
from vmsched.scheduling.hosts.arrays import BoolArray, FloatArray, IndexArray
from vmsched.scheduling.hosts.columns import (
    BOOLEAN,
    BOOLEAN_COLUMNS,
    NOTHING,
    NUMERIC,
    NUMERIC_COLUMNS,
    OBJECT,
    OBJECT_COLUMNS,
    PENDING_COLUMNS,
    CpuSamples,
    build,
    change_arrays,
    change_objects,
)
from vmsched.scheduling.hosts.derived import TableCache
from vmsched.scheduling.hosts.sequences import host_ids


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
    #: The decision's instant (unix seconds); NaN when no request set it. Units judge time by it
    #: (heartbeats, load duration): they never read the clock themselves.
    as_of: float = math.nan
    #: The whole cluster this table was taken from (None: this is it), for units that must look
    #: beyond the hosts still in play (where do a group's other VMs run?).
    _cluster: HostTable | None = field(default=None, repr=False)
    #: A sub-table's rows in `cluster`, ascending (None: the whole cluster, or not known).
    _rows: IndexArray | None = field(default=None, repr=False)
    #: This whole-cluster table with nothing pending, when this one was made from it by folding
    #: pending in: folding none in again gives it back instead of summing zeros.
    _unpended: HostTable | None = field(default=None, repr=False)
    #: A sub-table's parent and its rows there, which its array columns are taken from when first
    #: read and kept in `_cache` (None: every column is given).
    _taken_from: tuple[HostTable, IndexArray] | None = field(default=None, repr=False)
    #: What this table computed from its columns and keeps (see derived.py).
    _cache: TableCache = field(default_factory=TableCache, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def index(self) -> dict[str, int]:
        """host id -> position; made on first lookup (most sub-tables are never searched by id)."""
        return self._cache.positions(self.ids)

    @classmethod
    def _assemble(cls, **fields: Any) -> HostTable:
        """The table of `fields` (every field by name, a sub-table's array columns left out), as
        __init__ makes it, without passing 45 fields through it (several times per decision)."""
        table = object.__new__(cls)
        table.__dict__.update(fields)
        return table

    def _evolve(self, **changes: Any) -> HostTable:
        """A copy with `changes` (fields by name), as dataclasses.replace makes it, cheaply."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

    def columns(self) -> dict[str, Any]:
        """Every column by name (for building a modified copy)."""
        return {name: getattr(self, name) for name in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS, *OBJECT_COLUMNS)}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_states(cls, hosts: Iterable[HostState], settings: ClusterReport) -> HostTable:
        """The table of `hosts`, in their order (read once, no state kept: see columns.build)."""
        ids, cols = build(hosts)
        cache = TableCache(pending_rows=(cols["pending_vm_ids"], ()))
        return cls(ids=host_ids(ids), settings=settings, _cache=cache, **cols)

    def with_pending(self, entries: Iterable[PendingEntry], *, now: float | None = None) -> HostTable:
        """A copy with the pending columns summed from `entries` (other hosts' entries are ignored),
        evaluated at `now` when given."""
        return _pending.with_pending(self, entries, now)

    def with_more_pending(self, entries: Iterable[PendingEntry]) -> HostTable:
        """This whole-cluster table (made by `with_pending`) with `entries` pending as well, without
        folding the earlier entries again (pending.with_more_pending)."""
        return _pending.with_more_pending(self, entries)

    def pending_rows(self) -> tuple[int, ...]:
        """Positions of the hosts with a VM pending, ascending."""
        return self._cache.rows_pending(self.pending_vm_ids)

    #: `make(self)`: a per-host array computed from the settings and some columns only, kept for
    #: the next versions while those are the same objects (derived.derived).
    derived = _derived.derived
    #: The factors of a shared object column, kept for the next versions (derived.factors).
    factors = _derived.factors

    def with_rows(self, changed: Mapping[str, HostState], settings: ClusterReport | None = None) -> HostTable | None:
        """A copy with the rows of `changed` hosts replaced, or None if one of them is new here.

        The state caches and the simulator use this to move from one version to the next in
        O(changed hosts) instead of rebuilding every column (host order, hence positions, never
        changes here): only a column whose changed rows differ is copied (a VM's arrival changes a
        host's memory, load and VMs, not its networks or CPU models), and the others, with what
        was derived from them, are shared with this table.
        """
        positions: list[int] = []
        index = self.index
        for h in changed:
            i = index.get(h)
            if i is None:
                return None
            positions.append(i)
        states = list(changed.values())
        cols = self.columns()
        change_arrays(cols, positions, states)
        replaced = change_objects(cols, positions, states)
        cache = self._cache
        return self._assemble(
            ids=self.ids,
            settings=settings or self.settings,
            as_of=self.as_of,
            _cluster=None,
            _rows=None,
            _unpended=None,
            _taken_from=None,
            _cache=TableCache(cache.derived.carried(cols, positions, replaced), cache.index, cache.pending_rows),
            **cols,
        )

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
        for name in (*NUMERIC, *BOOLEAN):
            cols[name] = np.concatenate((getattr(self, name), getattr(fresh, name)))[state_take]
        for name in OBJECT:
            rows = (*getattr(self, name), *getattr(fresh, name))
            cols[name] = tuple(map(rows.__getitem__, state_rows))
        for name in PENDING_COLUMNS:
            cols[name] = np.concatenate((getattr(self, name), np.zeros(1)))[pending_take]
        pending_ids = (*self.pending_vm_ids, NOTHING)
        cols["pending_vm_ids"] = tuple(map(pending_ids.__getitem__, pending_rows))
        return HostTable(ids=host_ids(h for h, _ in order), settings=settings, as_of=self.as_of, **cols)

    # ------------------------------------------------------------------ sub-tables
    def index_of(self, host_ids: Iterable[str]) -> IndexArray:
        """Positions of `host_ids` in this table; unknown ids are skipped."""
        return _views.index_of(self, host_ids)

    def position(self, host_id: str) -> int | None:
        return _views.position(self, host_id)

    def take(self, positions: IndexArray | BoolArray) -> HostTable:
        """The sub-table of the hosts at `positions` (an index array or a boolean mask).

        Its array columns are taken from this table when first read (most units read a few of
        the 31) and its object columns read through to the cluster's."""
        return _views.take(self, positions)

    if not TYPE_CHECKING:  # for the type checker a HostTable has its fields and nothing else
        #: An array column of a sub-table, taken from its parent when first read.
        __getattr__ = _views.taken_column

    def subset(self, host_ids: Iterable[str]) -> HostTable:
        return _views.subset(self, host_ids)

    def view(self, host_ids: Sequence[str], pending: Iterable[PendingEntry], *, now: float | None = None) -> HostTable:
        """What a filter or weight unit is given: these hosts, with `pending` folded into the whole
        cluster first, so `locate` also finds a VM pending on a host outside the view (affinity
        groups need where every member is)."""
        return _views.view(self, host_ids, pending, now)

    def part(self, host_ids: Sequence[str]) -> HostTable:
        """These hosts of this whole-cluster table, with its pending as it is (`view` without folding)."""
        return _views.part(self, host_ids)

    @property
    def cluster(self) -> HostTable:
        """The table of the whole cluster (pending folded in), of which this one is a part."""
        return self._cluster if self._cluster is not None else self

    def mask_of(self, host_ids: Iterable[str]) -> BoolArray:
        """True at the hosts of `host_ids` (ids this table does not have are ignored)."""
        return _views.mask_of(self, host_ids)

    # ------------------------------------------------------------------ derived columns
    @property
    def effective_cpus(self) -> FloatArray:
        """Host CPUs as the cluster counts them: threads when it counts threads as cores."""
        if self.settings.count_threads_as_cores:
            return self.derived("effective_cpus", ("cpu_threads", "cpu_cores"), _threads_or_cores)
        return self.cpu_cores

    def has_network(self, network: str) -> BoolArray:
        return _derived.offering(self, "networks", network)

    def offering(self, name: str, value: str) -> BoolArray:
        """True at the hosts whose set in shared column `name` (networks, cpu_models, ...) holds
        `value`: one test per distinct set, not per host."""
        return _derived.offering(self, name, value)

    def holding(self, vm_ids: Iterable[str]) -> BoolArray:
        """True at the hosts where one of `vm_ids` runs or is pending."""
        out: BoolArray = self.members_on(vm_ids) > 0
        return out

    def members_on(self, vm_ids: Iterable[str]) -> FloatArray:
        """How many of `vm_ids` run or are pending on each host (a VM counts once per host)."""
        return _derived.members_on(self, vm_ids)

    def locate(self, vm_ids: Iterable[str]) -> dict[str, str]:
        """Where in the whole cluster these VMs run or are pending: {vm id: host id} (a VM on two
        hosts, mid-move, is named at the later in table order)."""
        return _derived.locate(self, vm_ids)

    def vms_on(self, i: int) -> frozenset[str]:
        """VMs on host i: running there, or placed there and pending."""
        return self.vm_ids[i] | self.pending_vm_ids[i]

    def group_metadata(self, i: int) -> list[Mapping[str, str]]:
        """Metadata of the host groups (aggregates) host i belongs to, in group-id order."""
        groups = self.settings.host_groups
        return [groups[g] for g in sorted(self.host_groups[i]) if g in groups]


def _threads_or_cores(t: HostTable) -> FloatArray:
    out: FloatArray = np.where(t.cpu_threads > 0, t.cpu_threads, t.cpu_cores)
    return out


# Keep the declarations honest: every dataclass column is in exactly one group.
assert {f for f in HostTable.__dataclass_fields__ if f not in ("ids", "settings", "as_of") and f[0] != "_"} == {
    *NUMERIC_COLUMNS,
    *BOOLEAN_COLUMNS,
    *OBJECT_COLUMNS,
}, "HostTable's fields and the column groups differ"

__all__ = ["HostTable"]
