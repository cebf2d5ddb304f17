"""A cluster's hosts as columns (NumPy arrays), the plain data every policy unit computes on.

Units see a HostTable restricted to the hosts still in play; each column is one array (or tuple)
aligned with `ids`, so a unit is a handful of vectorized expressions, not a loop over host objects.
Pending resources are already folded in as their own columns; a unit adds them where its formula
needs. `as_of` is the decision's instant, for units that judge time (heartbeats, load duration):
units never read the clock themselves.

The package's rooms, one job each:
  table.py      HostTable: the columns as fields, building a table and its next versions
  columns.py    which columns there are and how each is read from a host's state
  views.py      sub-tables (the hosts still in play) and finding hosts by id
  sequences.py  the lazy sequences a table holds its per-host objects and ids in
  derived.py    what a table derives from its columns and keeps for its next versions
  pending.py    folding pending resources into a table
  arrays.py     the column array types, and arrays of one value for every host
"""

from vmsched.scheduling.hosts.arrays import BoolArray, FloatArray, IndexArray, all_true, any_true, constant, is_constant
from vmsched.scheduling.hosts.columns import (
    BOOLEAN_COLUMNS,
    NUMERIC_COLUMNS,
    OBJECT_COLUMNS,
    PENDING_COLUMNS,
    CpuSamples,
)
from vmsched.scheduling.hosts.derived import Factors
from vmsched.scheduling.hosts.sequences import LazySequence, Patched, Prefix, SortedIds, TakenIds, ids_ascend
from vmsched.scheduling.hosts.table import HostTable

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
    "LazySequence",
    "Patched",
    "Prefix",
    "SortedIds",
    "TakenIds",
    "all_true",
    "any_true",
    "constant",
    "ids_ascend",
    "is_constant",
]
