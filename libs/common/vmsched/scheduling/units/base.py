"""What a policy unit is: a filter, a weight function, or both, plus its custom properties.

A unit is pure: `filter(hosts, vm, props)`, `weigh(hosts, vm, props)` and `balance(hosts, vms, props)`
read only their arguments (a HostTable already restricted to the hosts in play, with pending
resources folded in) and return plain values. No I/O, no clock, no globals, so the same code runs in
any service and in tests.

The purity contract (built-ins and plugins alike)
-------------------------------------------------
* A function of (hosts, vm or vms, properties) only: the same arguments give the same result, in
  every process and on every call (a filter-worker and a weigher must agree, and a decision must
  be explainable afterwards from what it was given).
* No I/O: no network, no files, no database, no subprocesses, no sleeping. A unit runs inside a
  decision while its cluster's lock is held, so every millisecond it takes is every request's.
* No global state: nothing read from or written to module globals, environment variables, the
  clock or a random generator; the arguments are not modified (the same HostTable is shared by
  every unit of a request).
* Deterministic: no randomness, no iteration over unordered sets into the result's order.

Units from other packages (plugins: the `vmsched.units` entry point group, see
vmsched.scheduling.units.plugins) follow the same contract and are held to it where it can be
checked: their names and property specs are validated when they are loaded, and each call is timed
against VMSCHED_PLUGIN_CALL_LIMIT_S (over it, the decision fails with a SchedulingError).

Conventions
-----------
* Filters return a FilterVerdict: a keep-mask aligned with the table and, for every removed host in
  table order, a reason with numbers ("free memory 487 MB < required 1088 MB").
* Weights return raw weights aligned with the table. Lower is better (oVirt's convention) unless the
  unit declares `direction = HIGHER_IS_BETTER`; selectors read the direction.
* Properties arrive as strings (oVirt stores them so) and are validated against the unit's regexes
  before any unit runs: `validate_properties` raises InvalidProperty naming property, value, regex.
  A value longer than MAX_PROPERTY_VALUE is refused before its regex runs, and every regex is
  checked for backtracking when its PropertySpec is made (regex_audit), so validation is linear.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from uuid import UUID, uuid5

import numpy as np

from vmsched.contracts import VmReport, VmSpec
from vmsched.scheduling.hosts import BoolArray, FloatArray, HostTable, IndexArray, LazySequence, all_true
from vmsched.scheduling.units.regex_audit import ambiguity
from vmsched.scheduling.units.validation import PropertyValidation, ValidationCache, validate_properties

Props = Mapping[str, str]

#: Namespace for stable unit ids: uuid5(UNIT_NAMESPACE, unit name) is the unit's row id in PostgreSQL.
UNIT_NAMESPACE = UUID("6f0c1c52-2b0e-4a59-9d36-5b0a3b0de001")
#: The origin of the units vmsched ships (PolicyUnit.origin).
BUILTIN_ORIGIN = "builtin"


class Direction(StrEnum):
    LOWER_IS_BETTER = "lower"
    HIGHER_IS_BETTER = "higher"


@dataclass(frozen=True)
class PropertySpec:
    """A custom property a unit reads: its regex (as oVirt declares it) and its default."""

    regex: str
    default: str | None
    description: str = ""

    def __post_init__(self) -> None:
        # A regex that can backtrack super-linearly would let one property value hold a worker for
        # seconds; refuse it when the unit is defined, not when a hostile value arrives.
        why = ambiguity(self.regex)
        if why is not None:
            raise ValueError(f"property regex {self.regex!r} may backtrack super-linearly: {why}")

    def matches(self, value: str) -> bool:
        return re.fullmatch(self.regex.removeprefix("^").removesuffix("$"), value) is not None


class LazyReasons(LazySequence[str]):
    """A filter's reasons, each made when first read: most decisions only count the removed hosts
    (the summary reads at most two reasons of a filter that removed many), and formatting a reason
    for each of thousands of removed hosts cost more than filtering them. Each reason is made once,
    whether read alone or with the rest."""

    __slots__ = ("_made", "_positions", "_reason", "keys")
    __hash__ = None  # type: ignore[assignment]  # equal to lists, as lists are: not hashable

    def __init__(self, reason: Callable[[int], str], positions: IndexArray, keys: IndexArray | None = None) -> None:
        self._reason, self._positions = reason, positions
        #: Per host of the table (None: not known): hosts of the same key have the same reason.
        self.keys = keys
        self._made: dict[int, str] = {}
        self._items = None

    def distinct(self, picks: Sequence[int] | None = None) -> list[str] | None:
        """The reasons of the items at `picks` (None: every item) when they come from few keys: one
        made per key, so whether they are all one reason costs no walk over thousands of hosts
        (None: no keys known; then read them)."""
        if self.keys is None:
            return None
        at = self._positions if picks is None else self._positions[np.asarray(picks, dtype=np.intp)]
        _, first = np.unique(self.keys[at], return_index=True)
        chosen = first if picks is None else np.asarray(picks, dtype=np.intp)[first]
        return [self._item(int(i)) for i in np.sort(chosen)]

    def _item(self, i: int) -> str:
        if i < 0:
            i += len(self)
        made = self._made.get(i)
        if made is None:
            made = self._made[i] = self._reason(int(self._positions[i]))
        return made

    def _make(self) -> tuple[str, ...]:
        return tuple(self._item(i) for i in range(len(self)))

    def __len__(self) -> int:
        return len(self._positions)


@dataclass(frozen=True)
class FilterVerdict:
    keep: BoolArray
    #: One reason per removed host, in table order.
    reasons: Sequence[str]
    #: The removed positions (~keep), when the verdict was built knowing them (None: not known).
    removed: IndexArray | None = field(default=None, compare=False, repr=False)

    @classmethod
    def keep_all(cls, hosts: HostTable) -> FilterVerdict:
        n = len(hosts)
        if len(_ALL[0]) < n:  # grown to the largest table seen
            ones = np.ones(max(n, 2 * len(_ALL[0])), dtype=np.bool_)
            ones.flags.writeable = False
            _ALL[0] = ones
        return cls(_ALL[0][:n], (), _NONE_REMOVED)

    @classmethod
    def from_mask(
        cls, hosts: HostTable, keep: BoolArray, reason: Callable[[int], str], keys: IndexArray | None = None
    ) -> FilterVerdict:
        """Build a verdict whose reasons call `reason(i)` for removed positions i, when read;
        `keys` (per host, optional): hosts of one key have one reason."""
        # Most filters remove no host: counting says so at a tenth of the cost of finding none.
        removed = _NONE_REMOVED if keep.dtype == np.bool_ and all_true(keep) else np.flatnonzero(~keep)
        return cls(keep, LazyReasons(reason, removed, keys), removed)

    def made(self) -> FilterVerdict:
        """This verdict with every reason made now (a plugin's, within its call's time limit)."""
        if isinstance(self.reasons, LazyReasons):
            return FilterVerdict(self.keep, list(self.reasons), self.removed)
        return self


_NONE_REMOVED: IndexArray = np.zeros(0, dtype=np.intp)
_NONE_REMOVED.flags.writeable = False
#: keep_all's masks are views of this one (read-only: a verdict's mask is never written). Its
#: content never changes, only its length (the largest table seen), so it carries no state.
_ALL: list[BoolArray] = [np.ones(0, dtype=np.bool_)]


class VmsByHost(LazySequence[VmReport]):
    """VMs held host by host (host id -> VM id -> report, each report's host_id its host's), read
    as one sequence, host after host in the mapping's order, of those `keep` admits; `on` gives
    one host's without reading the others' (a balance unit asks for its source hosts' VMs, and a
    cluster runs tens of thousands of VMs). A view of VMs that change: read it before they do, and
    never hash it."""

    __slots__ = ("_hosts", "_keep")
    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self, hosts: Mapping[str, Mapping[str, VmReport]], keep: Callable[[VmReport], bool] | None = None
    ) -> None:
        self._hosts, self._keep = hosts, keep
        self._items = None

    def on(self, host_id: str) -> list[VmReport]:
        """The host's VMs (those admitted), in order."""
        vms = self._hosts.get(host_id)
        if vms is None:
            return []
        keep = self._keep
        return list(vms.values()) if keep is None else [v for v in vms.values() if keep(v)]

    def kept(self, keep: Callable[[VmReport], bool]) -> VmsByHost:
        """These VMs, of them those `keep` admits too."""
        mine = self._keep
        return VmsByHost(self._hosts, keep if mine is None else lambda v: mine(v) and keep(v))

    def _item(self, i: int) -> VmReport:
        return self._tuple()[i]

    def _make(self) -> tuple[VmReport, ...]:
        keep = self._keep
        every = (v for vms in self._hosts.values() for v in vms.values())
        return tuple(every) if keep is None else tuple(v for v in every if keep(v))

    def __len__(self) -> int:
        return len(self._tuple())


@dataclass(frozen=True)
class Migration:
    """A balance unit's pick: move `vm_id` off `source_host` to one of `candidates` (the whitelist of
    the migration's schedule request), because of `reason` (in numbers)."""

    vm_id: str
    source_host: str
    candidates: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class PowerChange:
    """Power saving's advice: power `host_id` on or off ("power_on" / "power_off"), and why."""

    host_id: str
    action: str
    reason: str


class IdleKind(StrEnum):
    """Why a balancing pass moved nothing (the balancer logs it, the simulator counts it)."""

    NO_IMBALANCE = "no imbalance"
    NOT_HELD = "imbalance not held long enough"
    GAIN_BELOW_MARGIN = "gain below margin"
    BUDGET_EXHAUSTED = "budget exhausted"


@dataclass(frozen=True)
class BalanceOutcome:
    migration: Migration | None = None
    power: tuple[PowerChange, ...] = ()
    #: Without a migration: why (a unit that says nothing found no imbalance it acts on).
    idle_kind: IdleKind = IdleKind.NO_IMBALANCE
    idle: str = ""


FilterFn = Callable[[HostTable, VmSpec, Props], FilterVerdict]
WeightFn = Callable[[HostTable, VmSpec, Props], FloatArray]
#: (hosts with pending folded in and as_of set, the VMs the balancer may move, properties).
#: The VMs are already stripped of non-migratable, cooling-down and in-flight ones.
BalanceFn = Callable[[HostTable, Sequence[VmReport], Props], BalanceOutcome]


@dataclass(frozen=True, eq=False)  # units are singletons: identity is equality
class PolicyUnit:
    name: str
    description: str
    #: The short reason used in the aggregate line: "30 Memory (insufficient free memory)".
    summary: str = ""
    filter: FilterFn | None = None
    weight: WeightFn | None = None
    balance: BalanceFn | None = None
    direction: Direction = Direction.LOWER_IS_BETTER
    properties: Mapping[str, PropertySpec] = field(default_factory=dict)
    #: Fixed bounds of the raw weight, when the unit has them: `maximum` for the static-maximum
    #: selector, `minimum` for min-max normalization (Nova's minval).
    minimum: float | None = None
    maximum: float | None = None
    #: Where the unit comes from: BUILTIN_ORIGIN, or "<distribution> <version>" for a plugin's unit
    #: (set by the registry when it loads the plugin; a plugin's own value is replaced).
    origin: str = BUILTIN_ORIGIN
    #: The filter judges each host by the host's own row alone (with the VM, the properties, the
    #: cluster's settings and as_of), never by the other hosts of the table: the chain then runs it
    #: over hosts an earlier filter removed and drops those from its verdict, rather than copying
    #: the table between filters. Built-in units only (a plugin's is always False).
    filter_by_row: bool = False
    #: The property sets this unit has validated (validate_properties), kept as long as the unit.
    validation: PropertyValidation = field(default_factory=PropertyValidation, init=False, repr=False)

    @property
    def id(self) -> UUID:
        return uuid5(UNIT_NAMESPACE, self.name)

    @property
    def kinds(self) -> tuple[str, ...]:
        kinds = (("filter", self.filter), ("weight", self.weight), ("balance", self.balance))
        return tuple(k for k, fn in kinds if fn is not None)


def prop_int(props: Props, name: str, default: int) -> int:
    value = props.get(name)
    return default if value in (None, "") else int(value)


def prop_float(props: Props, name: str, default: float) -> float:
    value = props.get(name)
    return default if value in (None, "") else float(value)


def prop_bool(props: Props, name: str, default: bool) -> bool:
    value = props.get(name)
    return default if value in (None, "") else value.lower() == "true"


__all__ = [
    "BUILTIN_ORIGIN",
    "UNIT_NAMESPACE",
    "Direction",
    "FilterFn",
    "FilterVerdict",
    "IdleKind",
    "PolicyUnit",
    "PropertySpec",
    "Props",
    "ValidationCache",
    "VmsByHost",
    "WeightFn",
    "prop_bool",
    "prop_float",
    "prop_int",
    "validate_properties",
]
