"""Lazy sequences: the per-host values a table holds without copying them, read where they are.

A sub-table's object column, a version of a 10,000-host column with a few rows changed, and a
sub-table's ids are each read a few items at a time by most decisions and walked whole by few:
each reads one item from where it is (`_item`) until it is walked, sliced or hashed, and then
makes its items into a tuple once (`_make`) that every later read uses. LazySequence holds that
behaviour once; the kinds below say only where their items are, and so do a filter's reasons and the
VMs host by host (units.base.LazyReasons, VmsByHost) and the removed hosts (pipeline.Removals).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice, pairwise
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

T = TypeVar("T")
IndexArray = npt.NDArray[np.intp]


class LazySequence(Sequence[T]):
    """A sequence read item by item (`_item`) until it is read whole, then one tuple (`_make`).

    Equal to any sequence of the same items, hashed as their tuple."""

    __slots__ = ("_items",)

    _items: tuple[T, ...] | None

    def _item(self, i: int) -> T:
        """Item i (an int index, possibly negative), read without making the tuple."""
        raise NotImplementedError

    def _make(self) -> tuple[T, ...]:
        """Every item, in order."""
        raise NotImplementedError

    def _tuple(self) -> tuple[T, ...]:
        items = self._items
        if items is None:
            items = self._items = self._make()
        return items

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice) or self._items is not None:
            return self._tuple()[i]
        return self._item(i)

    def __iter__(self) -> Iterator[T]:
        return iter(self._tuple())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and self._tuple() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._tuple()!r})"


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


class Rows(LazySequence[T]):
    """The items of a column at some positions (a sub-table's object column).

    Copying every per-host object column on every sub-table cost more than the units that read
    them; a Rows holds the parent column and the positions."""

    __slots__ = ("_base", "_rows")

    def __init__(self, base: Sequence[T], rows: Positions) -> None:
        self._base, self._rows = base, rows
        self._items = None

    @classmethod
    def pick(cls, column: Sequence[T], rows: Positions) -> Sequence[T]:
        if isinstance(column, Rows):  # compose, so reads never go through a chain of views
            if column._items is not None:
                return cls(column._items, rows)
            return cls(column._base, Positions(column._rows.array[rows.array]))
        return cls(column, rows)

    def _item(self, i: int) -> T:
        return self._base[self._rows.list[i]]

    def _make(self) -> tuple[T, ...]:
        base = self._base._tuple() if isinstance(self._base, LazySequence) else self._base
        return tuple(map(base.__getitem__, self._rows.list))

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"Rows({list(self)!r})"


#: Changed rows a Patched column holds before a new version is a plain tuple again.
MAX_PATCHED = 64
_UNCHANGED: Any = object()


class Patched(LazySequence[T]):
    """An object column as an earlier version's tuple and the rows changed since: a version of a
    10,000-host column per decision without copying the 10,000 (a simulation changes a host or
    two between decisions). Reads by position look at the changes first; a walk over the whole
    column makes it a tuple once. `of` flattens it when the changes pile up."""

    __slots__ = ("_base", "_changes")

    def __init__(self, base: tuple[T, ...], changes: Mapping[int, T]) -> None:
        self._base, self._changes = base, changes
        self._items = None

    @classmethod
    def of(cls, column: Sequence[T], changes: Mapping[int, T]) -> Sequence[T]:
        """`column` with `changes`, flattened when they pile up."""
        if isinstance(column, Patched):
            base, changes = column._base, {**column._changes, **changes}
        else:
            base = column if isinstance(column, tuple) else tuple(column)
        if len(changes) > MAX_PATCHED:
            return _patch(base, changes)
        return cls(base, changes)

    def _item(self, i: int) -> T:
        if i < 0:
            i += len(self._base)
        changed = self._changes.get(i, _UNCHANGED)
        return self._base[i] if changed is _UNCHANGED else changed

    def _make(self) -> tuple[T, ...]:
        return _patch(self._base, self._changes)

    def __len__(self) -> int:
        return len(self._base)


def _patch(base: tuple[T, ...], changes: Mapping[int, T]) -> tuple[T, ...]:
    listed = list(base)
    for i, v in changes.items():
        listed[i] = v
    return tuple(listed)


class SortedIds(tuple[str, ...]):
    """Host ids in strictly ascending order: a table's ids when they are (the state caches keep
    their tables sorted by id), kept so through its sub-tables, so a selector breaks ties by id
    with a stable sort instead of comparing 10,000 strings on every decision."""

    __slots__ = ()


class TakenIds(LazySequence[str]):
    """A sub-table's host ids: the cluster's (an array of the same str objects) at its rows, looked
    up when read. Most sub-tables' ids are never read whole (a decision reads its best few), and
    a tuple of 10,000 ids cost more to make and to free than the units reading the sub-table."""

    __slots__ = ("_array", "_rows", "ascending")

    def __init__(self, array: npt.NDArray[np.object_], rows: IndexArray, ascending: bool) -> None:
        self._array, self._rows = array, rows
        #: Whether the ids ascend (they do when the cluster's do, rows ascending).
        self.ascending = ascending
        self._items = None

    def _item(self, i: int) -> str:
        found: str = self._array[self._rows[i]]
        return found

    def _make(self) -> tuple[str, ...]:
        return tuple(self._array[self._rows].tolist())

    def __len__(self) -> int:
        return len(self._rows)

    def rows_in(self, array: npt.NDArray[np.object_]) -> IndexArray | None:
        """These ids' rows in the table whose id array is `array` (None: taken from another)."""
        return self._rows if self._array is array else None


def ids_ascend(ids: Sequence[str]) -> bool:
    """Whether `ids` are known to ascend strictly, without comparing them (False: not known)."""
    return isinstance(ids, SortedIds) or (isinstance(ids, TakenIds) and ids.ascending)


def host_ids(ids: Iterable[str]) -> tuple[str, ...]:
    """`ids` as a tuple, a SortedIds when they ascend."""
    out = tuple(ids)
    return SortedIds(out) if all(a < b for a, b in pairwise(out)) else out


class Prefix(Sequence[T]):
    """The first `n` items of `log`, a list its owner only ever appends to: what each VM of a
    batch sees pending (the cluster's records, then the VMs placed before it), without a copy of
    them all for each VM. A reader that kept what it made of an earlier prefix of the same log
    reads only the items added since (`since`)."""

    __slots__ = ("log", "n")

    def __init__(self, log: list[T], n: int | None = None) -> None:
        self.log = log
        self.n = len(log) if n is None else n

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return self.log[: self.n][i]
        if not -self.n <= i < self.n:
            raise IndexError("Prefix index out of range")
        return self.log[i % self.n]

    def __iter__(self) -> Iterator[T]:
        return islice(self.log, self.n)

    def since(self, earlier: Prefix[T]) -> Sequence[T] | None:
        """The items after `earlier`, a prefix of the same log no longer than this one (None: it is not)."""
        if earlier.log is not self.log or earlier.n > self.n:
            return None
        return self.log[earlier.n : self.n]


__all__ = [
    "MAX_PATCHED",
    "LazySequence",
    "Patched",
    "Positions",
    "Prefix",
    "Rows",
    "SortedIds",
    "TakenIds",
    "host_ids",
    "ids_ascend",
]
