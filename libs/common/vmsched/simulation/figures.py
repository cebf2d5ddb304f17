"""The report's operator figures over a run, from its samples: energy (and what power-offs saved),
CPU demand not met, host-hours over HighUtilization, overcommit, and packing as a ratio of means.

Samples are held as steps: a sample's value lasts until the next sample (the last one until the end
of the run), so a figure integrated over time is the sum of value x that duration. The sampler runs
every `sample_interval_s`; what changes between two samples is seen at the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: Joules in a kWh.
J_PER_KWH = 3_600_000.0


class Timed(Protocol):
    @property
    def at_s(self) -> float: ...


def durations(samples: Sequence[Timed], end_s: float) -> list[float]:
    """How long each sample's values hold: to the next sample, the last to `end_s`."""
    times = [s.at_s for s in samples]
    if not times:
        return []
    return [max(0.0, b - a) for a, b in zip(times, [*times[1:], max(end_s, times[-1])], strict=True)]


def integral(values: Sequence[float], held: Sequence[float]) -> float:
    """Sum of value x seconds held."""
    return float(sum(v * d for v, d in zip(values, held, strict=True)))


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


__all__ = ["J_PER_KWH", "durations", "integral", "ratio"]
