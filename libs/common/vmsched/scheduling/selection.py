"""Selectors: turn the raw weights of several units into one ordering of hosts (oVirt's selection step).

Raw weights of different units live on different scales (MB vs %), so a selector first maps each
unit's raw weights onto a common footing ("points"), then sums factor x points per host:

* ``RankSelector`` (oVirt's default): competition ranks, only the order of weights matters.
* ``StaticMaximumSelector``: percent of a fixed per-unit maximum (``WeighedUnit.maximum``).
* ``DynamicMaximumSelector``: percent of the largest weight reported in this attempt.
* ``MinMaxSelector`` (Nova): ``(w - min) / (max - min)`` per unit.

Every selector has the same signature (:data:`SelectorFn`) and returns a :class:`Selection` that keeps
each unit's raw weights and points so the decision can be shown as a score table.

Conventions shared by all selectors:

* ``raw`` is aligned with ``host_ids``; NaN marks a host the unit did not report, which counts as a
  raw weight of 0 (oVirt's RankSelector does the same).
* A unit's ``direction`` says whether its lower (oVirt) or higher (Nova) raw weights are better.
* Final ties are broken by host id, ascending (plain string order), so the result does not depend on
  the order hosts arrive in. Totals are compared rounded to 9 decimals so that fractional factors
  cannot split a tie through floating-point noise.
* With `top`, only the best `top` hosts are ordered (a placement needs the best and its alternates,
  not the order of 10,000 hosts); they are the same hosts, in the same order, as the first `top` of
  the whole ordering.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from types import MappingProxyType
from typing import Final, Protocol

import numpy as np

from vmsched.contracts import ScoreTable, UnitScores
from vmsched.scheduling.hosts import FloatArray, IndexArray, TakenIds, constant, ids_ascend, is_constant
from vmsched.scheduling.units.base import Direction

#: Decimals totals are rounded to before they are compared (ties, ordering).
TOTAL_DECIMALS: Final = 9


@dataclass(frozen=True, eq=False)
class WeighedUnit:
    """One weight unit's result as a selector consumes it."""

    unit: str
    factor: float
    #: Raw weights aligned with the selector's host_ids; NaN = not reported (counts as 0).
    raw: FloatArray
    direction: Direction = Direction.LOWER_IS_BETTER
    #: The fixed maximum of this unit's weights, for the StaticMaximumSelector only.
    maximum: float | None = None
    #: A fixed lower bound for min-max normalization (Nova weighers with minval = 0).
    minimum: float | None = None

    @classmethod
    def from_mapping(
        cls,
        host_ids: Sequence[str],
        unit: str,
        factor: float,
        weights: Mapping[str, float],
        direction: Direction = Direction.LOWER_IS_BETTER,
        maximum: float | None = None,
    ) -> WeighedUnit:
        """Build from {host id: weight}; hosts missing from `weights` become NaN (not reported)."""
        raw = np.fromiter((weights.get(h, np.nan) for h in host_ids), dtype=np.float64, count=len(host_ids))
        return cls(unit, factor, raw, direction, maximum)


@dataclass(frozen=True, eq=False)
class Selection:
    """A selector's result. Arrays are aligned with ``host_ids`` (input order); ``order`` sorts them.

    ``points[k]`` is what the selector made of unit k's raw weights: rank points for the RankSelector
    (higher is better), a percentage for the maximum selectors (lower is better), a 0..1 value for
    min-max (higher is better). ``higher_wins`` says how ``totals`` compare.
    """

    selector: str
    host_ids: Sequence[str]
    #: Positions into host_ids, best host first (only the best `top` when the selector was given one).
    order: list[int]
    totals: FloatArray
    #: Per unit: unit name, factor and raw weights as used (not reported -> 0).
    units: tuple[str, ...] = ()
    factors: tuple[float, ...] = ()
    raw: list[FloatArray] = field(default_factory=list)
    points: list[FloatArray] = field(default_factory=list)
    higher_wins: bool = True

    @property
    def best(self) -> str | None:
        return self.host_ids[self.order[0]] if self.order else None

    @property
    def ordered_ids(self) -> list[str]:
        return [self.host_ids[i] for i in self.order]

    def to_score_table(self, top: int | None = None) -> ScoreTable:
        """The inspectable table: hosts best first, each unit's raw weights and points in that order.

        With `top`, only the best `top` hosts and their totals, without the per-unit rows: what a
        placement needs when nobody asked to see the scores.
        """
        if top is not None:
            best = np.asarray(self.order[:top], dtype=np.intp)
            return ScoreTable.model_construct(
                selector=self.selector,
                hosts=[self.host_ids[i] for i in best.tolist()],
                units=[],
                totals=self.totals[best].tolist(),
            )
        order = np.asarray(self.order, dtype=np.intp)
        # model_construct: these are floats this process just computed, not input to validate; at
        # 1,000 hosts x 18 units, validation would cost more than the selection itself.
        return ScoreTable.model_construct(
            selector=self.selector,
            hosts=self.ordered_ids,
            units=[
                UnitScores.model_construct(unit=u, factor=f, raw=r[order].tolist(), points=p[order].tolist())
                for u, f, r, p in zip(self.units, self.factors, self.raw, self.points, strict=True)
            ],
            totals=self.totals[order].tolist(),
        )


class SelectorFn(Protocol):
    """Order `host_ids` by the units' weights: all of them, or only the best `top`."""

    def __call__(
        self, host_ids: Sequence[str], units: Sequence[WeighedUnit], *, top: int | None = None
    ) -> Selection: ...


#: Maps one unit's raw weights (NaN already replaced; their least and greatest) to its points.
PointsFn = Callable[[WeighedUnit, FloatArray, float, float], FloatArray]


# ------------------------------------------------------------------------------ shared machinery
def _effective_raw(n: int, unit: WeighedUnit) -> tuple[FloatArray, float, float]:
    """The unit's weights with NaN (not reported) as 0, and their least and greatest."""
    raw = np.asarray(unit.raw, dtype=np.float64)
    if raw.shape != (n,):
        raise ValueError(f"unit {unit.unit}: {raw.shape[0] if raw.ndim else 0} weights for {n} hosts")
    if not n:
        return raw, math.nan, math.nan
    if is_constant(raw):  # one weight for every host, stored once
        value = 0.0 if np.isnan(raw[0]) else float(raw[0])
        return (constant(n, 0.0) if np.isnan(raw[0]) else raw), value, value
    lo, hi = float(np.minimum.reduce(raw)), float(np.maximum.reduce(raw))  # NaN when any weight is
    if math.isnan(lo):
        raw = np.where(np.isnan(raw), 0.0, raw)
        lo, hi = float(np.minimum.reduce(raw)), float(np.maximum.reduce(raw))
    return raw, lo, hi


def _ids_ascending(host_ids: Sequence[str]) -> bool:
    # A table's ids say when they are known to ascend: comparing 10,000 strings per decision cost
    # more than the sort it saves.
    return ids_ascend(host_ids) or all(a < b for a, b in pairwise(host_ids))


def _best_rows(key: FloatArray, top: int, higher_wins: bool = False) -> IndexArray | None:
    """Positions (ascending) of the hosts whose key is at least as good as the `top`-th best key
    (the smallest, or with `higher_wins` the largest): the best `top` hosts are among them whatever
    breaks ties. None when that takes a full sort (NaN keys). The key is read as it is, not negated
    first (a pass over every host saved per decision)."""
    first, worse = (np.maximum, np.less) if higher_wins else (np.minimum, np.greater)
    at_least = np.greater_equal if higher_wins else np.less_equal
    bound = first.reduce(key)
    for _ in range(top):  # each round admits at least one more host
        if np.isnan(bound):
            return None
        rows: IndexArray = np.flatnonzero(at_least(key, bound))
        if len(rows) >= top:
            return rows
        bound = first.reduce(key[worse(key, bound)])
    return None


def _order(
    host_ids: Sequence[str], totals: FloatArray, higher_wins: bool, top: int | None = None, *, whole: bool = False
) -> list[int]:
    """Positions best first (only the best `top` with `top`). `whole`: the totals are known to be
    whole numbers below 2**53 / 10**TOTAL_DECIMALS, which rounding to TOTAL_DECIMALS gives back
    unchanged (x * 10**9 is exact, rint keeps it, the division gives x back), so it is skipped."""
    if not host_ids:
        return []
    key = totals if whole else np.round(totals, TOTAL_DECIMALS)
    rows = _best_rows(key, top, higher_wins) if top is not None and top < len(host_ids) else None
    if rows is not None:
        key = key[rows]
    primary = -key if higher_wins else key
    if _ids_ascending(host_ids):
        # Already in id order (a cluster's hosts are kept sorted by id): a stable sort on the totals
        # breaks ties by id, without building and comparing an array of strings.
        ranked: IndexArray = np.argsort(primary, kind="stable")
    else:
        # lexsort sorts by the last key first: totals, then host id for ties.
        picked = host_ids if rows is None else [host_ids[i] for i in rows.tolist()]
        ranked = np.lexsort((np.asarray(picked, dtype=np.str_), primary))
    if top is not None:
        ranked = ranked[:top]
    if rows is not None:
        ranked = rows[ranked]
    order: list[int] = ranked.tolist()
    return order


def _select(
    name: str,
    host_ids: Sequence[str],
    units: Sequence[WeighedUnit],
    points_fn: PointsFn,
    higher_wins: bool,
    top: int | None = None,
    *,
    whole_points: bool = False,
) -> Selection:
    """`whole_points`: `points_fn` gives whole numbers of at most n - 1 (rank points), so with
    whole factors the totals are whole too and need no rounding before they are compared."""
    # A table's ids as they are: a copy would lose what they know (ascending) and cost a pass.
    ids = host_ids if isinstance(host_ids, (tuple, TakenIds)) else tuple(host_ids)
    n = len(ids)
    bounded = [_effective_raw(n, u) for u in units]
    raws = [r for r, _, _ in bounded]
    points = [points_fn(u, r, lo, hi) for u, (r, lo, hi) in zip(units, bounded, strict=True)]
    totals = np.zeros(n, dtype=np.float64)
    scaled = np.empty(n, dtype=np.float64)
    for u, p in zip(units, points, strict=True):
        # A unit that weighs every host the same adds one number (the same sums, in the same order).
        if is_constant(p):
            totals += u.factor * p[0]
        else:
            totals += np.multiply(p, u.factor, out=scaled)  # factor x points, into one buffer
    return Selection(
        selector=name,
        host_ids=ids,
        order=_order(ids, totals, higher_wins, top, whole=whole_points and _whole_sums(units, n)),
        totals=totals,
        units=tuple(u.unit for u in units),
        factors=tuple(float(u.factor) for u in units),
        raw=raws,
        points=points,
        higher_wins=higher_wins,
    )


def _whole_sums(units: Sequence[WeighedUnit], n: int) -> bool:
    """Whether sums of factor x (whole points of at most n - 1) are whole numbers that rounding to
    TOTAL_DECIMALS leaves as they are: every factor whole and every partial sum of magnitude at
    most (n - 1) x the factors' total below 2**53 / 10**TOTAL_DECIMALS (exact in a double even
    times 10**TOTAL_DECIMALS)."""
    bound = max(n - 1, 0) * sum(abs(float(u.factor)) for u in units)
    return bound < _EXACT_TOTAL and all(float(u.factor).is_integer() for u in units)


#: Largest whole total that x 10**TOTAL_DECIMALS is still an exact double (2**53).
_EXACT_TOTAL: Final = float(2**53) / 10**TOTAL_DECIMALS


# ------------------------------------------------------------------------------ rank
#: Largest spread of whole-number raw weights ranked by counting (a bin per value) instead of sorting.
_COUNTING_SPAN: Final = 1 << 16


def rank_points(
    raw: FloatArray,
    direction: Direction = Direction.LOWER_IS_BETTER,
    bounds: tuple[float, float] | None = None,
) -> FloatArray:
    """Competition rank points: (n - 1) - (number of hosts strictly better).

    The best host earns n - 1; tied hosts share the higher number of points (the lower index), as in
    oVirt's RankSelectorPolicyUnit ("rank = the number of hosts with the same or worse weight").
    `bounds`: the weights' least and greatest, when known.
    """
    n = raw.shape[0]
    if n == 0:
        return np.zeros(0)
    if bounds is None:
        bounds = (float(np.minimum.reduce(raw)), float(np.maximum.reduce(raw)))  # NaN when any is NaN: sort
    lo, hi = bounds
    if lo == hi:  # one weight everywhere (a unit with nothing to say about this VM): nobody is better
        return constant(n, n - 1.0)
    codes = _codes(raw, lo, hi)
    if codes is not None:
        # Whole numbers over a small range (loads in %, oVirt's 1..1000 scales), maybe with a few
        # far outliers (a unit's worst weight): counted per value, O(n), where sorting 10,000
        # weights per unit per decision was most of the selection.
        counts = np.bincount(codes)
        below = np.cumsum(counts) - counts  # hosts with a strictly smaller weight, per value
        per_value = below if direction is Direction.LOWER_IS_BETTER else n - (below + counts)
        # Points per value first (a few hundred), then one lookup per host.
        # Every code is a position in the table by construction: "clip" skips take's bounds
        # checks (several times faster at 10,000 hosts; the same values).
        counted: FloatArray = ((n - 1) - per_value).astype(np.float64).take(codes, mode="clip")
        return counted
    ordered = np.sort(raw)
    if direction is Direction.LOWER_IS_BETTER:
        better = np.searchsorted(ordered, raw, side="left")
    else:
        better = n - np.searchsorted(ordered, raw, side="right")
    points: FloatArray = ((n - 1) - better).astype(np.float64)
    return points


def _codes(raw: FloatArray, lo: float, hi: float) -> IndexArray | None:
    """Non-negative integer codes that order and tie as `raw` does, for counting: the whole-number
    weights within _COUNTING_SPAN of the least, then a few others above them, in their order. None
    when the weights are not so (not whole, too spread, not finite): sort them instead."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if hi - lo <= _COUNTING_SPAN:
        if np.count_nonzero(np.floor(raw) != raw):  # counted: faster than all() at 10,000 hosts
            return None
        codes: IndexArray = (raw - lo).astype(np.intp)
        return codes
    near = raw <= lo + _COUNTING_SPAN
    far = ~near
    close, away = raw[near], raw[far]
    if np.count_nonzero(np.floor(close) != close):
        return None
    codes = np.empty(len(raw), dtype=np.intp)
    codes[near] = (close - lo).astype(np.intp)
    first = int(close.max() - lo) + 1
    if float(away.min()) == float(away.max()):  # one far value (a unit's worst weight): one more code
        codes[far] = first
    elif len(away) <= len(raw) // 8:
        _, order = np.unique(away, return_inverse=True)
        codes[far] = first + order.reshape(-1)
    else:
        return None
    return codes


def rank_select(host_ids: Sequence[str], units: Sequence[WeighedUnit], *, top: int | None = None) -> Selection:
    """oVirt's RankSelector: score = sum of factor x rank points; the highest score wins.

    oVirt's weight-normalization design counts rank the other way round (number of hosts better,
    lower wins);
    its value is sum(factor) x (n - 1) - score for every host, so both give the same order.
    """
    return _select(
        "RankSelector",
        host_ids,
        units,
        lambda u, r, lo, hi: rank_points(r, u.direction, (lo, hi)),
        True,
        top,
        whole_points=True,
    )


# ------------------------------------------------------------------------------ maximum-based
def percent_of(raw: FloatArray, maximum: float, direction: Direction) -> FloatArray:
    """Whole percent of `maximum`, truncated (as in oVirt's normalization example: 50 of 90 -> 55), lower is better.

    For a higher-is-better unit the complement (100 - percent) is used so lower still wins. Negative
    weights stay negative (their magnitude is compared with |maximum|); a 0 maximum gives 0 everywhere.
    """
    if maximum == 0:
        return np.zeros_like(raw)
    pct = np.trunc(raw * 100.0 / abs(maximum))
    return pct if direction is Direction.LOWER_IS_BETTER else 100.0 - pct


def _dynamic_points(unit: WeighedUnit, raw: FloatArray, lo: float = math.nan, hi: float = math.nan) -> FloatArray:
    maximum = float(np.abs(raw).max()) if raw.size else 0.0
    return percent_of(raw, maximum, unit.direction)


def _static_points(unit: WeighedUnit, raw: FloatArray, lo: float = math.nan, hi: float = math.nan) -> FloatArray:
    if unit.maximum is None:
        # A unit without a declared maximum falls back to this attempt's maximum.
        return _dynamic_points(unit, raw)
    return percent_of(raw, unit.maximum, unit.direction)


def dynamic_maximum_select(
    host_ids: Sequence[str], units: Sequence[WeighedUnit], *, top: int | None = None
) -> Selection:
    """Sum of factor x (percent of the largest |weight| of the unit in this attempt); lowest wins."""
    return _select("DynamicMaximumSelector", host_ids, units, _dynamic_points, False, top)


def static_maximum_select(
    host_ids: Sequence[str], units: Sequence[WeighedUnit], *, top: int | None = None
) -> Selection:
    """Sum of factor x (percent of the unit's fixed `maximum`); lowest wins."""
    return _select("StaticMaximumSelector", host_ids, units, _static_points, False, top)


# ------------------------------------------------------------------------------ min-max (Nova)
def min_max_points(raw: FloatArray, direction: Direction, minimum: float | None = None) -> FloatArray:
    """Nova's normalization onto 0..1, flipped for lower-is-better units so 1 is always best.

    All weights equal -> 0 for every host (Nova). A unit with a fixed lower bound (Nova's
    `minval = 0` weighers: RAM, CPU, disk) normalizes from that bound instead of the observed minimum.
    """
    if raw.size == 0:
        return raw.copy()
    lo, hi = float(raw.min()), float(raw.max())
    if minimum is not None:
        lo = min(lo, minimum)
    if hi == lo:
        return constant(len(raw), 0.0)
    span = hi - lo
    return (raw - lo) / span if direction is Direction.HIGHER_IS_BETTER else (hi - raw) / span


def min_max_select(host_ids: Sequence[str], units: Sequence[WeighedUnit], *, top: int | None = None) -> Selection:
    """Nova's weighing: sum of factor x min-max normalized weight; the highest wins."""
    return _select(
        "MinMaxSelector", host_ids, units, lambda u, r, lo, hi: min_max_points(r, u.direction, u.minimum), True, top
    )


SELECTORS: Final[Mapping[str, SelectorFn]] = MappingProxyType(
    {
        "RankSelector": rank_select,
        "StaticMaximumSelector": static_maximum_select,
        "DynamicMaximumSelector": dynamic_maximum_select,
        "MinMaxSelector": min_max_select,
    }
)
DEFAULT_SELECTOR: Final = "RankSelector"

__all__ = [
    "DEFAULT_SELECTOR",
    "SELECTORS",
    "Selection",
    "SelectorFn",
    "WeighedUnit",
    "dynamic_maximum_select",
    "min_max_points",
    "min_max_select",
    "percent_of",
    "rank_points",
    "rank_select",
    "static_maximum_select",
]
