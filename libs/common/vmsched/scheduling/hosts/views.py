"""Sub-tables: the hosts of a table still in play, and finding hosts by id.

Units see a table restricted to the hosts still in play, taken again after every filter that
removes some. A sub-table copies no column when made: it knows its rows in the whole cluster
(when they ascend) and reads those from it, its array columns taken from its parent when first
read (most units read a few of the 31) and its object columns read through to the cluster's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vmsched.contracts import PendingEntry
from vmsched.scheduling.hosts.arrays import BoolArray, IndexArray
from vmsched.scheduling.hosts.columns import ARRAY_COLUMNS, OBJECT_COLUMNS
from vmsched.scheduling.hosts.derived import TableCache, id_array
from vmsched.scheduling.hosts.sequences import Positions, Rows, TakenIds, ids_ascend

if TYPE_CHECKING:
    from vmsched.scheduling.hosts.table import HostTable


def take(table: HostTable, positions: IndexArray | BoolArray) -> HostTable:
    """HostTable.take: the sub-table of the hosts at `positions` (an index array or a boolean mask)."""
    mask = positions.dtype == np.bool_
    pos: IndexArray = np.flatnonzero(positions) if mask else positions.astype(np.intp)
    ascending = mask or bool(np.all(pos[1:] > pos[:-1]))
    if len(pos) and not _within(pos, ascending, len(table)):
        # Negative positions count from the end and others raise, as numpy's take does: made
        # plain positions here, so every later take may skip its bounds checks ("clip").
        pos = np.arange(len(table), dtype=np.intp).take(pos)
        ascending = bool(np.all(pos[1:] > pos[:-1]))
    cluster = table.cluster
    rows: IndexArray | None = None
    if ascending and (table._cluster is None or table._rows is not None):
        rows = pos if table._rows is None else table._rows.take(pos, mode="clip")
    if rows is not None:
        # The cluster's rows: read from the cluster, never through a chain of views.
        at_rows = Positions(rows)
        objects: dict[str, Sequence[Any]] = {name: Rows(getattr(cluster, name), at_rows) for name in OBJECT_COLUMNS}
        ids = TakenIds(id_array(cluster), rows, ascending and ids_ascend(cluster.ids))
        source: tuple[HostTable, IndexArray] = (cluster, rows)
    else:
        at_pos = Positions(pos)
        objects = {name: Rows.pick(getattr(table, name), at_pos) for name in OBJECT_COLUMNS}
        ids = TakenIds(id_array(table), pos, ascending and ids_ascend(table.ids))
        source = (table, pos)
    return type(table)._assemble(
        ids=ids,
        settings=table.settings,
        as_of=table.as_of,
        _cluster=cluster,
        _rows=rows,
        _unpended=None,
        _taken_from=source,
        _cache=TableCache(),
        **objects,
    )


def _within(pos: IndexArray, ascending: bool, n: int) -> bool:
    """Whether every position is a row of a table of n rows (0 <= p < n)."""
    low, high = (int(pos[0]), int(pos[-1])) if ascending else (int(pos.min()), int(pos.max()))
    return low >= 0 and high < n


def taken_column(table: HostTable, name: str) -> Any:
    """An array column of a sub-table: taken from its parent on first read, kept in the
    sub-table's cache for the next reads (most units read a few of the 31 columns)."""
    try:  # a column read before: units read a few columns several times each
        return table.__dict__["_cache"].taken[name]
    except KeyError:
        return _take_column(table, name)


def _take_column(table: HostTable, name: str) -> Any:
    fields = table.__dict__
    source = fields.get("_taken_from")
    if source is None or name not in ARRAY_COLUMNS:
        raise AttributeError(f"{type(table).__name__!r} object has no attribute {name!r}")
    parent, rows = source
    # Faster than a mask; "clip": `rows` are the parent's positions (checked in `take`), and
    # numpy's bounds checks made a float column's take several times slower.
    value = fields["_cache"].taken[name] = getattr(parent, name).take(rows, mode="clip")
    return value


def subset(table: HostTable, host_ids: Iterable[str]) -> HostTable:
    """HostTable.subset: the sub-table of `host_ids` (ids it does not have are skipped)."""
    if isinstance(host_ids, TakenIds):
        # A sub-table's ids of this very table (the candidates when some host is down): its
        # rows are known, no id is looked up.
        rows = host_ids.rows_in(id_array(table))
        if rows is not None:
            return take(table, rows)
    return take(table, index_of(table, host_ids))


def view(table: HostTable, host_ids: Sequence[str], pending: Iterable[PendingEntry], now: float | None) -> HostTable:
    """HostTable.view: these hosts, with `pending` folded into the whole cluster first."""
    return part(table.with_pending(pending, now=now), host_ids)


def part(whole: HostTable, host_ids: Sequence[str]) -> HostTable:
    """HostTable.part: these hosts of a whole-cluster table, as it is (its pending, its instant)."""
    if host_ids is whole.ids or (len(host_ids) == len(whole) and tuple(host_ids) == whole.ids):
        return whole
    return subset(whole, host_ids)


def index_of(table: HostTable, host_ids: Iterable[str]) -> IndexArray:
    """Positions of `host_ids` in `table`; unknown ids are skipped."""
    if host_ids is table.ids or (isinstance(host_ids, tuple) and host_ids == table.ids):
        return np.arange(len(table), dtype=np.intp)  # every host, in order: nothing to look up
    idx = table.index
    return np.fromiter((idx[h] for h in host_ids if h in idx), dtype=np.intp)


def position(table: HostTable, host_id: str) -> int | None:
    """The position of `host_id` in `table` (None: not there)."""
    rows = table._rows
    if rows is not None and not table._cache.indexed(table.ids):
        # A sub-table: its position among its rows in the cluster, without indexing its ids.
        p = table.cluster.position(host_id)
        if p is None:
            return None
        j = int(np.searchsorted(rows, p))
        return j if j < len(rows) and rows[j] == p else None
    return table.index.get(host_id)


def mask_of(table: HostTable, host_ids: Iterable[str]) -> BoolArray:
    """True at the hosts of `host_ids` (ids `table` does not have are ignored)."""
    mask = np.zeros(len(table), dtype=np.bool_)
    for h in host_ids:
        i = position(table, h)
        if i is not None:
            mask[i] = True
    return mask


__all__ = ["index_of", "mask_of", "part", "position", "subset", "take", "taken_column", "view"]
