"""Every host's CPU %, memory % and VM count over a simulation, for the heat maps: kept in at most a fixed
number of time columns however long the run, and shaped into the host x time matrix a heat map
draws (hosts grouped into bands when there are more than a picture can show one per row).

A column's value is the mean over its samples in which the host was up; a host down for the whole
column has none (NaN). The mean, not the max, because a heat map answers "how busy was this host
then", and the max of a long column would paint a host full that was full for one sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

import numpy as np
import numpy.typing as npt

from vmsched.scheduling.hosts import BoolArray, FloatArray

#: Time columns kept at most: about one per pixel column of a heat map.
MAX_COLUMNS = 300
#: Host rows drawn at most; more hosts are grouped into bands of consecutive hosts.
MAX_ROWS = 200

Metric = Literal["cpu", "mem", "vms"]
METRICS: tuple[Metric, ...] = ("cpu", "mem", "vms")
SumArray = npt.NDArray[np.float32]
CountArray = npt.NDArray[np.int32]


Column = TypeVar("Column", SumArray, CountArray)


def _pairs(columns: list[Column]) -> list[Column]:
    """Columns 0+1, 2+3, ... (an even number of them), summed into the even ones."""
    for i in range(0, len(columns), 2):
        columns[i] += columns[i + 1]
    return columns[0::2]


class HostSeries:
    """Per-host CPU %, memory % and VM count at each sample, in at most `max_columns` time columns.

    Every column holds `samples_per_column` consecutive samples (the last one may hold fewer).
    When a new sample would make one column too many, neighbouring columns are merged in pairs and
    `samples_per_column` doubles, so a column is always a whole number of samples and the memory
    kept is hosts x max_columns whatever the run's length. Sums and counts are kept, not means, so
    merging is exact.
    """

    def __init__(self, max_columns: int = MAX_COLUMNS) -> None:
        if max_columns < 2 or max_columns % 2:
            raise ValueError(f"max_columns must be even and at least 2, not {max_columns}")
        self.max_columns = max_columns
        self.samples_per_column = 1
        self.host_ids: tuple[str, ...] = ()
        #: Per column: the first and last sample's time (simulated s) and how many samples it holds.
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.samples: list[int] = []
        self._sums: dict[Metric, list[SumArray]] = {m: [] for m in METRICS}
        #: Per column and host: the samples in which the host was up.
        self._up: list[CountArray] = []

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, at_s: float, host_ids: Sequence[str], values: Mapping[Metric, FloatArray], down: BoolArray) -> None:
        """One sample: each host's value of every metric, and whether it is down (its values then
        count for nothing). Hosts are kept in the first sample's order."""
        if not self.host_ids:
            self.host_ids = tuple(host_ids)
        elif tuple(host_ids) != self.host_ids:
            values, down = self._aligned(host_ids, values, down)
        up = ~down
        now = {m: np.where(up, values[m], 0.0).astype(np.float32) for m in METRICS}
        if self.samples and self.samples[-1] < self.samples_per_column:
            for m in METRICS:
                self._sums[m][-1] += now[m]
            self._up[-1] += up
            self.ends[-1] = at_s
            self.samples[-1] += 1
            return
        if len(self.samples) == self.max_columns:
            self._merge_pairs()
        for m in METRICS:
            self._sums[m].append(now[m])
        self._up.append(up.astype(np.int32))
        self.starts.append(at_s)
        self.ends.append(at_s)
        self.samples.append(1)

    def _aligned(
        self, host_ids: Sequence[str], values: Mapping[Metric, FloatArray], down: BoolArray
    ) -> tuple[dict[Metric, FloatArray], BoolArray]:
        """The values in this series' host order; a host the sample lacks counts as down."""
        where = {h: i for i, h in enumerate(host_ids)}
        pos = np.array([where.get(h, -1) for h in self.host_ids], dtype=np.intp)
        known = pos >= 0
        safe = np.where(known, pos, 0)
        return {m: values[m][safe] for m in METRICS}, np.where(known, down[safe], True)

    def _merge_pairs(self) -> None:
        self._sums = {m: _pairs(columns) for m, columns in self._sums.items()}
        self._up = _pairs(self._up)
        self.starts = self.starts[0::2]
        self.ends = self.ends[1::2]
        self.samples = [self.samples[i] + self.samples[i + 1] for i in range(0, len(self.samples), 2)]
        self.samples_per_column *= 2

    def sums(self, metric: Metric) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
        """hosts x columns: the metric summed over each column's samples in which the host was up,
        and how many those were."""
        if not self.samples:
            return np.zeros((len(self.host_ids), 0)), np.zeros((len(self.host_ids), 0), dtype=np.int64)
        return np.stack(self._sums[metric], axis=1).astype(np.float64), np.stack(self._up, axis=1).astype(np.int64)


@dataclass(frozen=True)
class HeatMap:
    """A heat map's data: rows of hosts (or bands of them) by time columns."""

    #: rows x columns, in %; NaN where every host of the row was down throughout the column.
    values: npt.NDArray[np.float64]
    #: A host id per row, or "first-last" for a band.
    row_labels: tuple[str, ...]
    hosts_per_row: int
    #: columns + 1 edges in simulated seconds: between two columns, halfway from one's last sample
    #: to the next one's first; the outer edges are the first and last sample.
    edges_s: npt.NDArray[np.float64]
    samples_per_column: int


def column_edges(starts: Sequence[float], ends: Sequence[float]) -> npt.NDArray[np.float64]:
    if not starts:
        return np.zeros(1)
    inner = [(ends[i] + starts[i + 1]) / 2.0 for i in range(len(starts) - 1)]
    return np.array([starts[0], *inner, ends[-1]], dtype=np.float64)


def heat_map(series: HostSeries, metric: Metric, max_rows: int = MAX_ROWS) -> HeatMap:
    """The host x time matrix of `metric` (each cell the mean over the column's samples in which the
    host was up). Up to `max_rows` hosts get a row each, in the order the workload lists them; more
    are grouped into bands of consecutive hosts, as few per band as fit, a band's cell being the
    mean over all its hosts' up samples."""
    sums, up = series.sums(metric)
    hosts = len(series.host_ids)
    per_row = max(1, math.ceil(hosts / max_rows))
    if per_row > 1:
        firsts = list(range(0, hosts, per_row))
        sums = np.add.reduceat(sums, firsts, axis=0) if sums.size else sums[: len(firsts)]
        up = np.add.reduceat(up, firsts, axis=0) if up.size else up[: len(firsts)]
        ids = series.host_ids
        labels = tuple(f"{ids[f]}-{ids[min(f + per_row, hosts) - 1]}" for f in firsts)
    else:
        labels = series.host_ids
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(up > 0, sums / np.maximum(up, 1), np.nan)
    return HeatMap(
        values=values,
        row_labels=labels,
        hosts_per_row=per_row,
        edges_s=column_edges(series.starts, series.ends),
        samples_per_column=series.samples_per_column,
    )


def scale_top(peak: float, *, percent: bool) -> float:
    """The top of a colour scale that shows values up to `peak`: a round number just above it, so a
    run whose hosts stay under 10 % is not drawn all pale; percentages stop at 100 (above it is its
    own colour), counts are whole and at least 1."""
    if not percent:
        return float(max(1, math.ceil(peak)))
    for top in (5.0, 10.0, 20.0, 25.0, 50.0, 75.0):
        if peak <= top:
            return top
    return 100.0


__all__ = [
    "MAX_COLUMNS",
    "MAX_ROWS",
    "METRICS",
    "HeatMap",
    "HostSeries",
    "Metric",
    "column_edges",
    "heat_map",
    "scale_top",
]
