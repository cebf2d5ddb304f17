"""The array types of a table's columns, and arrays of one value for every host."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]


def constant(n: int, value: float) -> FloatArray:
    """`value` for each of n hosts, as a read-only array that stores it once: what a unit with
    nothing to say about a VM returns, which a selector tells apart without reading n values."""
    # The scalar is the one value every host's element reads (a stride of 0), held by the array.
    out: FloatArray = np.ndarray((n,), dtype=np.float64, buffer=np.float64(value), strides=(0,))
    out.flags.writeable = False
    return out


def is_constant(values: npt.NDArray[Any]) -> bool:
    """Whether `values` is a `constant` array (one value stored once)."""
    return values.ndim == 1 and values.strides == (0,) and len(values) > 0


__all__ = ["BoolArray", "FloatArray", "IndexArray", "constant", "is_constant"]
