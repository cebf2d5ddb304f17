"""The array types of a table's columns, and arrays of one value for every host."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]

#: A float as the 8 bytes of a C double: the buffer of a `constant` array.
_DOUBLE = struct.Struct("d")


def constant(n: int, value: float) -> FloatArray:
    """`value` for each of n hosts, as a read-only array that stores it once: what a unit with
    nothing to say about a VM returns, which a selector tells apart without reading n values."""
    # The one value every host's element reads (a stride of 0): 8 bytes, held by the array.
    out: FloatArray = np.ndarray((n,), dtype=np.float64, buffer=_DOUBLE.pack(value), strides=(0,))
    out.flags.writeable = False
    return out


def all_true(mask: BoolArray) -> bool:
    """Whether every element of the boolean array `mask` is True (True when empty): counted, which
    at 10,000 hosts is several times faster than `mask.all()` (a logical-and reduction)."""
    return int(np.count_nonzero(mask)) == mask.size


def any_true(mask: BoolArray) -> bool:
    """Whether some element of the boolean array `mask` is True: counted, as in `all_true`."""
    return int(np.count_nonzero(mask)) > 0


def is_constant(values: npt.NDArray[Any]) -> bool:
    """Whether `values` is a `constant` array (one value stored once)."""
    return values.ndim == 1 and values.strides == (0,) and len(values) > 0


__all__ = ["BoolArray", "FloatArray", "IndexArray", "all_true", "any_true", "constant", "is_constant"]
