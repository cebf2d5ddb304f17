"""The scheduling pipeline as pure functions: candidates, filter chain, weights, selection, summary.

The oVirt/Nova pipeline: candidates, filters, weights, selection; with one host left there is
nothing to weigh. Units are looked up by name in `units`, the caller's registry (the process's
REGISTRY when not given). The filter-worker runs `run_filters`, the weigher `run_weights` and `select`;
how they compose into a decision is vmsched.scheduling.placement.place, which the selector runs
with steps over the bus and the in-process paths with placement.LocalSteps. Same code either way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from pydantic import TypeAdapter

from vmsched.contracts import FilteredHost, ScoreTable, UnitCall, VmSpec
from vmsched.contracts.base import MAX_TEXT
from vmsched.errors import SchedulingError
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, IndexArray, LazySequence, all_true, any_true
from vmsched.scheduling.selection import SELECTORS, WeighedUnit
from vmsched.scheduling.units import REGISTRY, get_unit, validate_properties
from vmsched.scheduling.units.base import FilterVerdict, LazyReasons, PolicyUnit

_FILTERED: TypeAdapter[list[FilteredHost]] = TypeAdapter(list[FilteredHost])


def candidate_hosts(
    table: HostTable, whitelist: Sequence[str] | None = None, blacklist: Sequence[str] = ()
) -> HostTable:
    """Up hosts of the cluster, minus the blacklist, intersected with the whitelist when given."""
    keep = table.up.copy()
    if whitelist is not None:
        allowed = np.zeros(len(table), dtype=np.bool_)
        allowed[table.index_of(whitelist)] = True
        keep &= allowed
    if blacklist:
        keep[table.index_of(blacklist)] = False
    if all_true(keep):
        return table  # the usual case: every host is a candidate, so copying the columns buys nothing
    return table.take(keep)


class Removal(NamedTuple):
    """One host a filter removed, and why (a FilteredHost before validation: most decisions only
    count them for the summary, and building hundreds of models for that costs more than filtering)."""

    host_id: str
    filter: str
    reason: str


class Removals(LazySequence[Removal]):
    """The hosts a filter chain removed, filter by filter, as Removal rows made when first read.

    Most decisions only count them for the summary, which reads at most two reasons of a filter
    that removed many hosts (`tally`); making a row and a reason for each of thousands of removed
    hosts cost more than filtering them. Filled while the chain runs (`add`), so never hashed."""

    __slots__ = ("_groups",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self) -> None:
        #: (filter, host ids of its table, the positions it removed, their reasons)
        self._groups: list[tuple[str, Sequence[str], list[int], Sequence[str]]] = []
        self._items = None

    def add(self, unit: str, ids: Sequence[str], gone: list[int], reasons: Sequence[str]) -> None:
        self._groups.append((unit, ids, gone, reasons))
        self._items = None

    def _item(self, i: int) -> Removal:
        return self._tuple()[i]

    def _make(self) -> tuple[Removal, ...]:
        return tuple(
            Removal(ids[i], unit, _fit(reason))
            for unit, ids, gone, reasons in self._groups
            for i, reason in zip(gone, reasons, strict=True)
        )

    def __len__(self) -> int:
        return sum(len(gone) for _, _, gone, _ in self._groups)

    def tally(self) -> list[tuple[str, int, str | None]]:
        """Per filter, in order of first removal: how many hosts it removed, and their reason when
        they all share one (None when they do not)."""
        counts: dict[str, int] = {}
        single: dict[str, str | None] = {}
        for unit, _, gone, reasons in self._groups:
            if not gone:
                continue
            counts[unit] = counts.get(unit, 0) + len(gone)
            first = single[unit] if unit in single else _fit(reasons[0])
            # One reason per key when the filter knows which hosts share one; else made one by
            # one, up to the first that differs.
            few = _distinct(reasons)
            for k in range(len(reasons) if few is None else len(few)):
                if first is None or _fit(reasons[k] if few is None else few[k]) != first:
                    first = None
                    break
            single[unit] = first
        return [(unit, n, single[unit]) for unit, n in counts.items()]


def _distinct(reasons: Sequence[str]) -> list[str] | None:
    """The distinct reasons of a filter's reasons, one per key, when its verdict knows keys."""
    if isinstance(reasons, LazyReasons):
        return reasons.distinct()
    if isinstance(reasons, _Picked) and isinstance(reasons._base, LazyReasons):
        return reasons._base.distinct(reasons._picks)
    return None


def filtered_hosts(removed: Sequence[Removal | FilteredHost]) -> list[FilteredHost]:
    """The removed hosts as the explanation and FilterReply carry them."""
    if all(isinstance(r, FilteredHost) for r in removed):
        return [r for r in removed if isinstance(r, FilteredHost)]
    # One validation of plain rows in pydantic-core beats building hundreds of models one by one.
    return _FILTERED.validate_python([{"host_id": r.host_id, "filter": r.filter, "reason": r.reason} for r in removed])


@dataclass(frozen=True)
class FilterOutcome:
    survivors: HostTable
    removals: Sequence[Removal]

    @property
    def removed(self) -> list[FilteredHost]:
        return filtered_hosts(self.removals)


def _fit(reason: str) -> str:
    """A reason within FilteredHost.reason's bound: reasons quote request and host values (repr
    escapes can make a 255-character value ten times longer), and one reason over the bound would
    fail the whole filter reply."""
    return reason if len(reason) <= MAX_TEXT else reason[: MAX_TEXT - 3] + "..."


class _Picked(LazySequence[str]):
    """The items of `base` at `picks`, read when read (a filter's reasons for the hosts it removed
    that were still in play)."""

    __slots__ = ("_base", "_picks")

    def __init__(self, base: Sequence[str], picks: list[int]) -> None:
        self._base, self._picks = base, picks
        self._items = None

    def _item(self, i: int) -> str:
        return self._base[self._picks[i]]

    def _make(self) -> tuple[str, ...]:
        base = self._base
        return tuple(base[j] for j in self._picks)

    def __len__(self) -> int:
        return len(self._picks)


def run_filters(
    hosts: HostTable, vm: VmSpec, calls: Sequence[UnitCall], *, units: Mapping[str, PolicyUnit] = REGISTRY
) -> FilterOutcome:
    """Run the chain: each filter sees only the survivors of the previous one; stop when none is left.

    A filter that judges each host by its own row (`PolicyUnit.filter_by_row`) runs over the table
    as it was when the run of such filters began, and what it says of hosts already removed is
    dropped: the same survivors and removals, with one copy of the table per run instead of one
    per filter that removes a host."""
    rows = Removals()
    #: Hosts of `hosts` still in play, when filters by row have removed some since it was taken.
    alive: BoolArray | None = None
    for call in calls:
        if len(hosts) == 0 or (alive is not None and not any_true(alive)):
            break
        unit = get_unit(call.unit, units)
        if alive is not None and not unit.filter_by_row:
            hosts, alive = hosts.take(alive), None
        verdict, gone = _filter(unit, hosts, vm, call)
        reasons: Sequence[str] = verdict.reasons
        if alive is not None:
            fresh = alive[gone]
            if not all_true(fresh):  # removed already by an earlier filter: not this one's
                picks = np.flatnonzero(fresh)
                gone, reasons = gone[picks], _Picked(reasons, picks.tolist())
        if not len(gone):
            continue
        rows.add(unit.name, hosts.ids, gone.tolist(), reasons)
        if not unit.filter_by_row:
            hosts = hosts.take(verdict.keep)
        else:
            alive = verdict.keep.copy() if alive is None else alive & verdict.keep
    if alive is not None:
        hosts = hosts.take(alive)
    return FilterOutcome(hosts, rows)


def _filter(unit: PolicyUnit, hosts: HostTable, vm: VmSpec, call: UnitCall) -> tuple[FilterVerdict, IndexArray]:
    """The unit's verdict on `hosts`, and the positions it removes."""
    if unit.filter is None:
        raise SchedulingError(f"policy unit {unit.name} is not a filter", location="filters")
    verdict = unit.filter(hosts, vm, validate_properties(unit, call.properties))
    gone = verdict.removed if verdict.removed is not None else _removed(verdict.keep)
    if len(gone) != len(verdict.reasons):
        raise AssertionError(f"filter {unit.name} gave {len(verdict.reasons)} reasons for {len(gone)} hosts")
    return verdict, gone


def _removed(keep: BoolArray) -> IndexArray:
    """The positions `keep` says False at: counted first, since most filters remove no host and
    the count is a tenth of the cost of finding none."""
    return _NONE if keep.dtype == np.bool_ and all_true(keep) else np.flatnonzero(~keep)


_NONE: IndexArray = np.zeros(0, dtype=np.intp)
_NONE.flags.writeable = False


def run_weights(
    hosts: HostTable, vm: VmSpec, calls: Sequence[UnitCall], *, units: Mapping[str, PolicyUnit] = REGISTRY
) -> list[FloatArray]:
    """Every unit's raw weight for every host, aligned with `hosts.ids`."""
    out: list[FloatArray] = []
    for call in calls:
        unit = get_unit(call.unit, units)
        if unit.weight is None:
            raise SchedulingError(f"policy unit {unit.name} is not a weight unit", location="weights")
        raw = np.asarray(unit.weight(hosts, vm, validate_properties(unit, call.properties)), dtype=np.float64)
        if raw.shape != (len(hosts),):
            raise AssertionError(f"weight unit {unit.name} returned shape {raw.shape} for {len(hosts)} hosts")
        out.append(raw)
    return out


def select(
    host_ids: Sequence[str],
    calls: Sequence[UnitCall],
    raws: Sequence[FloatArray],
    selector: str = "RankSelector",
    *,
    top: int | None = None,
    units: Mapping[str, PolicyUnit] = REGISTRY,
) -> ScoreTable:
    """Order the hosts best first and keep the whole table for the explanation (or, with `top`, only
    the best `top` hosts and their totals)."""
    fn = SELECTORS.get(selector)
    if fn is None:
        raise SchedulingError(f"unknown selector {selector!r}; known: {sorted(SELECTORS)}", location="selector")
    weighed = []
    for call, raw in zip(calls, raws, strict=True):
        unit = get_unit(call.unit, units)
        weighed.append(
            WeighedUnit(
                unit=call.unit,
                factor=call.factor,
                raw=raw,
                direction=unit.direction,
                maximum=unit.maximum,
                minimum=unit.minimum,
            )
        )
    return fn(host_ids, weighed, top=top).to_score_table(top)


def rank(
    hosts: HostTable,
    vm: VmSpec,
    calls: Sequence[UnitCall],
    selector: str,
    *,
    top: int | None = None,
    units: Mapping[str, PolicyUnit] = REGISTRY,
) -> ScoreTable:
    """Weigh `hosts` for `vm` with every unit and rank them best first (`top`: only the best few,
    without the per-unit table). With no weight units the hosts keep their order, which is the
    cluster's stable host order, as oVirt keeps the filter order when nothing weighs."""
    if not calls:
        return unweighed(hosts.ids, selector, top=top)
    return select(hosts.ids, calls, run_weights(hosts, vm, calls, units=units), selector, top=top, units=units)


def screen(
    hosts: HostTable,
    vm: VmSpec,
    filters: Sequence[UnitCall],
    weights: Sequence[UnitCall] | None,
    selector: str,
    *,
    top: int | None = None,
    units: Mapping[str, PolicyUnit] = REGISTRY,
) -> tuple[FilterOutcome, ScoreTable | None]:
    """The filter step: run the filters, then, when `weights` is given (None: weigh elsewhere) and
    two or more hosts survive, rank the survivors as the weigh step would."""
    outcome = run_filters(hosts, vm, filters, units=units)
    if weights is None or len(outcome.survivors) < 2:
        return outcome, None
    return outcome, rank(outcome.survivors, vm, weights, selector, top=top, units=units)


def unweighed(host_ids: Sequence[str], selector: str, *, top: int | None = None) -> ScoreTable:
    """The ranking when a policy has no weight units: the hosts in the order they came."""
    kept = list(host_ids) if top is None else list(host_ids[:top])
    return ScoreTable(selector=selector, hosts=kept, units=[], totals=[0.0] * len(kept))


def summarize(
    candidates: int,
    available: int,
    removed: Sequence[Removal | FilteredHost],
    *,
    units: Mapping[str, PolicyUnit] = REGISTRY,
) -> str:
    """The aggregate line: `3/50 hosts available: 30 Memory (insufficient free memory), 17 Network (...)`.

    When every host a filter removed was removed for the same reason, that reason is shown;
    otherwise the unit's short summary.
    """
    head = f"{available}/{candidates} hosts available"
    if not removed:
        return head
    if isinstance(removed, Removals):
        tallied = removed.tally()
    else:
        counts = Counter(f.filter for f in removed)
        reasons: dict[str, set[str]] = {}
        for f in removed:
            reasons.setdefault(f.filter, set()).add(f.reason)
        tallied = [
            (name, n, next(iter(reasons[name])) if len(reasons[name]) == 1 else None) for name, n in counts.items()
        ]
    parts = []
    # Most removed first; ties in the order the filters first removed a host (Counter.most_common).
    for name, n, reason in sorted(tallied, key=lambda t: t[1], reverse=True):
        why = reason
        if why is None:
            try:
                why = get_unit(name, units).summary or name
            except SchedulingError:
                why = name
        parts.append(f"{n} {name} ({why})")
    return f"{head}: " + ", ".join(parts)
