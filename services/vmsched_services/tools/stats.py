"""Summary statistics the demo, the bench and the fault suite report."""

from __future__ import annotations

from collections.abc import Iterable


def percentile(values: Iterable[float], p: float) -> float:
    """The p-th percentile (0-100) by nearest rank over the sorted values; 0.0 for no values."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]
