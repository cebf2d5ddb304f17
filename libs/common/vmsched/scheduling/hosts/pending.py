"""Pending resources folded into a table: what is placed on hosts and not yet running.

oVirt's scheduler API: "whatever usage data is passed ... must pass the used and the pending
resources together". A table carries what is pending as its own columns (PENDING_COLUMNS and
pending_vm_ids), summed here from the pending entries; a unit adds them where its formula needs.
Most decisions have nothing pending: then nothing is copied, and a table folded from one with
nothing pending gives that one back when nothing is pending again.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from vmsched.contracts import PendingEntry
from vmsched.scheduling.hosts.arrays import FloatArray
from vmsched.scheduling.hosts.columns import BOOLEAN_COLUMNS, NOTHING, NUMERIC_COLUMNS, OBJECT_COLUMNS, PENDING_COLUMNS
from vmsched.scheduling.hosts.derived import TableCache
from vmsched.scheduling.hosts.sequences import Patched

if TYPE_CHECKING:
    from vmsched.scheduling.hosts.table import HostTable

#: What a table is of, but for what is pending and the instant.
STATE_FIELDS: tuple[str, ...] = (
    "ids",
    "settings",
    "_cluster",
    *(
        c
        for c in (*NUMERIC_COLUMNS, *BOOLEAN_COLUMNS, *OBJECT_COLUMNS)
        if c not in (*PENDING_COLUMNS, "pending_vm_ids")
    ),
)


def with_pending(table: HostTable, entries: Iterable[PendingEntry], now: float | None) -> HostTable:
    """HostTable.with_pending: a copy with the pending columns summed from `entries` (other hosts'
    entries are ignored), evaluated at `now` when given."""
    index = table.index
    placed = [(i, e) for e in entries if (i := index.get(e.host_id)) is not None]
    as_of = table.as_of if now is None else now
    if not placed and nothing_pending(table):
        # Nothing pending before or after (a simulation's usual decision): nothing to copy,
        # and a sub-table's columns stay its cluster's.
        return table._evolve(as_of=as_of)
    unpended = table._unpended
    if not placed and unpended is not None and same_state(table, unpended):
        return unpended._evolve(as_of=as_of)
    empty = table._cluster is None and nothing_pending(table)
    if table._cluster is not None:
        unpended = None
    elif empty:
        unpended = table
    n = len(table)
    zeros = tuple(np.zeros(n, dtype=np.float64) for _ in range(4))
    # Most hosts have nothing pending: the column of a table with nothing pending (every host's
    # set empty) with the few rows that hold a VM changed, not a new list and tuple of n sets.
    base = table.pending_vm_ids if empty else unpended.pending_vm_ids if unpended is not None else None
    return _fold(table, placed, as_of, unpended, zeros, base if base is not None else (NOTHING,) * n, set())


def with_more_pending(folded: HostTable, entries: Iterable[PendingEntry]) -> HostTable:
    """`folded`, a whole-cluster table that `with_pending` made, with `entries` pending as well:
    the table `with_pending` makes of every entry folded so far and then these, without folding
    the earlier ones again (a batch's VMs see the ones placed before them: folding them all for
    each VM made a batch cost the square of its size). The sums are made in the same order, so
    the columns are the same numbers."""
    if folded._cluster is not None:
        raise ValueError("pending is folded into a whole cluster's table, not a sub-table")
    index = folded.index
    placed = [(i, e) for e in entries if (i := index.get(e.host_id)) is not None]
    if not placed:
        return folded
    unpended = folded if nothing_pending(folded) else folded._unpended
    columns = (folded.pending_mem_mb, folded.pending_vcpus, folded.pending_cpus_pinned, folded.pending_vm_count)
    copies = tuple(c.copy() for c in columns)
    return _fold(folded, placed, folded.as_of, unpended, copies, folded.pending_vm_ids, set(folded.pending_rows()))


def _fold(
    table: HostTable,
    placed: list[tuple[int, PendingEntry]],
    as_of: float,
    unpended: HostTable | None,
    sums: tuple[FloatArray, ...],
    vm_ids: Sequence[frozenset[str]],
    rows: set[int],
) -> HostTable:
    """`table` with the pending columns `sums` (memory, vCPUs, pinned CPUs, VM count), given fresh
    here, and `vm_ids` (rows `rows` holding a VM; not changed here), plus `placed` (row, entry)
    added in order."""
    mem, vcpus, pinned, count = sums
    changed: dict[int, frozenset[str]] = {}
    for i, e in placed:
        mem[i] += e.mem_mb
        vcpus[i] += e.vcpus
        pinned[i] += e.cpus_pinned
        count[i] += 1
        changed[i] = changed.get(i, vm_ids[i]) | {e.vm_id}
        rows.add(i)
    # The rows that hold a VM now over the column as it was (a copy once they pile up).
    pending_ids = Patched.of(vm_ids, changed)
    cache = table._cache
    return table._evolve(
        pending_mem_mb=mem,
        pending_vcpus=vcpus,
        pending_cpus_pinned=pinned,
        pending_vm_count=count,
        pending_vm_ids=pending_ids,
        as_of=as_of,
        # A sub-table's pending no longer is its cluster's: it reads its own rows from now on.
        _rows=None,
        _unpended=unpended,
        # The columns a sub-table took from its parent so far stay valid: the parent is the same.
        _cache=TableCache(cache.derived, cache.index, (pending_ids, tuple(sorted(rows))), cache.taken),
    )


def same_state(table: HostTable, other: HostTable) -> bool:
    """Whether `other` has this table's hosts, settings and state columns (the same objects)."""
    return all(getattr(table, name) is getattr(other, name) for name in STATE_FIELDS)


def nothing_pending(table: HostTable) -> bool:
    """Whether nothing is pending on any host of `table`."""
    if table.pending_rows():
        return False
    columns = (table.pending_mem_mb, table.pending_vcpus, table.pending_cpus_pinned, table.pending_vm_count)
    store = table._cache.derived
    known = store.zero_pending
    if known is not None and all(map(operator.is_, known, columns)):
        return True
    if any(np.count_nonzero(c) for c in columns):
        return False
    store.zero_pending = columns
    return True


__all__ = ["STATE_FIELDS", "nothing_pending", "same_state", "with_more_pending", "with_pending"]
