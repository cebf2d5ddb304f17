"""Policy units from other packages: the `vmsched.units` entry point group.

A package adds units by naming them in its pyproject.toml:

    [project.entry-points."vmsched.units"]
    racks = "vmsched_example_units:UNITS"

The object an entry point names is a PolicyUnit or a sequence of them (examples/vmsched-example-units
is a complete package). The registry loads the group once, when it is first built (every service
at start, `vmsched units list`), by these rules:

* An entry point that fails to load, or gives anything but a PolicyUnit or a non-empty sequence of
  them, is refused whole.
* A unit is checked as the built-ins are by their construction and by the message models: a name
  the bus accepts, property names likewise, every property regex compiled and passed by the
  backtracking audit (regex_audit), every default matching its regex. A unit that fails is refused.
* A unit whose name is taken is refused: by a built-in, or by another plugin's unit (then every
  claimant is refused, so what runs never depends on the order packages happen to be found in).

A refusal is logged once (package, entry point, unit, reason) and kept by the registry, so
`vmsched units list` shows why a unit is missing; it never stops the process.

An accepted unit gets its origin ("<distribution> <version>") and its functions wrapped: a call that
takes longer than the call limit (VMSCHED_PLUGIN_CALL_LIMIT_S) raises a SchedulingError naming the
unit, the time taken and the bound. A running Python call cannot be interrupted safely, so the bound
is checked when the call returns: the decision fails instead of a slow unit quietly slowing every
decision of its clusters (it runs under the cluster's lock). An exception a plugin's function raises
becomes a SchedulingError naming the unit as well, so the request gets a decision that says which
unit failed rather than an internal error. Built-in units are not wrapped.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TypeVar, cast

from pydantic import TypeAdapter, ValidationError

from vmsched.constants import UNIT_ENTRY_POINT_GROUP
from vmsched.contracts.base import MAX_PROPERTY_VALUE, MAX_TEXT, Name
from vmsched.errors import SchedulingError, UnsupportedRegex, VmschedError
from vmsched.logging import get_logger
from vmsched.scheduling.units.base import Direction, FilterVerdict, PolicyUnit, PropertySpec, Props
from vmsched.scheduling.units.regex_audit import ambiguity

log = get_logger("vmsched.units.plugins")

#: The origin of a plugin whose distribution cannot be found (an entry point made by hand).
UNKNOWN_ORIGIN = "unknown"

#: Unit and property names travel in UnitCall (a Name, with its properties' keys): a unit the bus
#: cannot name could never be called.
_NAME: TypeAdapter[str] = TypeAdapter(Name)
#: Where the error of a failed call points, as the pipeline's own errors do.
_LOCATION = {"filter": "filters", "weight": "weights", "balance": "balance"}
#: Bound on the text of a plugin's exception quoted in an error (it travels in a bounded reply).
_QUOTE_MAX = 500

EntryPoints = Callable[[], Iterable[metadata.EntryPoint]]


@dataclass(frozen=True)
class RefusedPlugin:
    """A plugin entry point, or one unit of it, that was not loaded, and why."""

    #: "<distribution> <version>" of the package that declared the entry point (or UNKNOWN_ORIGIN).
    package: str
    #: The entry point as declared: "racks = vmsched_example_units:UNITS".
    entry_point: str
    reason: str
    #: The unit refused, when the entry point loaded and one of its units was refused.
    unit: str | None = None

    def __str__(self) -> str:
        what = f"unit {self.unit} of " if self.unit else ""
        return f"{what}{self.package} entry point '{self.entry_point}': {self.reason}"


@dataclass
class CallLimit:
    """The per-call bound of plugin units, read on every call (a service sets it from its settings)."""

    seconds: float


@dataclass(frozen=True)
class LoadedPlugins:
    #: Accepted units, with their origin set and their functions time-bound.
    units: tuple[PolicyUnit, ...]
    refused: tuple[RefusedPlugin, ...]


def discover() -> list[metadata.EntryPoint]:
    """The installed entry points of the group, in a stable order (by distribution, then name)."""
    found = metadata.entry_points(group=UNIT_ENTRY_POINT_GROUP)
    return sorted(found, key=lambda ep: (ep.dist.name if ep.dist is not None else "", ep.name, ep.value))


def origin_of(ep: metadata.EntryPoint) -> str:
    """ "<distribution> <version>" of the package an entry point belongs to.

    An entry point found by `discover` knows its distribution; one made by hand is looked up by the
    top-level package of the module it names.
    """
    try:
        dist = ep.dist
        if dist is None:
            names = metadata.packages_distributions().get(ep.module.split(".")[0], [])
            if len(set(names)) != 1:
                return UNKNOWN_ORIGIN
            dist = metadata.distribution(names[0])
        return f"{dist.name} {dist.version}"
    except Exception:  # broken metadata must not stop the registry
        return UNKNOWN_ORIGIN


#: A unit an entry point offers: (unit, origin, entry point).
_Claim = tuple[PolicyUnit, str, str]


def load_plugins(
    entry_points: Iterable[metadata.EntryPoint], taken: Collection[str], limit: CallLimit
) -> LoadedPlugins:
    """Load every entry point; refuse what breaks a rule (see the module docstring), log each refusal.

    `taken` is the built-in unit names. Never raises for anything a plugin does (except
    KeyboardInterrupt, which is the operator's).
    """
    refused: list[RefusedPlugin] = []
    claims: list[_Claim] = []
    for ep in entry_points:
        _load(ep, claims, refused)
    accepted = _settle(claims, taken, limit, refused)
    for r in refused:
        log.warning("plugin refused", package=r.package, entry_point=r.entry_point, unit=r.unit, reason=r.reason)
    return LoadedPlugins(tuple(accepted), tuple(refused))


def _load(ep: metadata.EntryPoint, claims: list[_Claim], refused: list[RefusedPlugin]) -> None:
    """Import one entry point: its valid units go to `claims`, the rest to `refused`."""
    where = f"{ep.name} = {ep.value}"
    origin = origin_of(ep)
    try:
        units = _units_of(ep.load())
    except (Exception, SystemExit) as exc:
        units = f"failed to load: {_quote(exc)}"
    if isinstance(units, str):
        refused.append(RefusedPlugin(origin, where, units))
        return
    for unit in units:
        problem = unit_problem(unit)
        if problem is None:
            claims.append((unit, origin, where))
        else:
            name = unit.name if isinstance(unit.name, str) else repr(unit.name)
            refused.append(RefusedPlugin(origin, where, problem, unit=name[:MAX_TEXT]))


def _settle(
    claims: list[_Claim], taken: Collection[str], limit: CallLimit, refused: list[RefusedPlugin]
) -> list[PolicyUnit]:
    """The claims whose name is free and claimed once, made ready to run; the others refused."""
    by_name: dict[str, list[int]] = defaultdict(list)
    for i, (unit, _, _) in enumerate(claims):
        by_name[unit.name].append(i)
    accepted: list[PolicyUnit] = []
    for i, (unit, origin, where) in enumerate(claims):
        rivals = [f"{claims[j][1]} '{claims[j][2]}'" for j in by_name[unit.name] if j != i]
        if unit.name in taken:
            reason = f"the name {unit.name} is a built-in unit's"
        elif rivals:
            reason = f"the name {unit.name} is also claimed by {'; '.join(rivals)}"
        else:
            accepted.append(bounded(unit, origin, limit))
            continue
        refused.append(RefusedPlugin(origin, where, reason, unit=unit.name))
    return accepted


def _units_of(obj: object) -> tuple[PolicyUnit, ...] | str:
    """The units an entry point gave, or why what it gave is not units."""
    if isinstance(obj, PolicyUnit):
        return (obj,)
    if isinstance(obj, str | bytes) or not isinstance(obj, Sequence):
        return f"gave a {type(obj).__name__}, not a PolicyUnit or a sequence of them"
    items = tuple(obj)
    if not items:
        return "gave an empty sequence: no units"
    for i, item in enumerate(items):
        if not isinstance(item, PolicyUnit):
            return f"gave a sequence holding a {type(item).__name__} at position {i}, not a PolicyUnit"
    return items


def _quote(exc: BaseException) -> str:
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose text cannot be read
        text = type(exc).__name__
    return text if len(text) <= _QUOTE_MAX else text[: _QUOTE_MAX - 3] + "..."


def unit_problem(unit: PolicyUnit) -> str | None:
    """Why a unit cannot be registered, or None: what the built-ins satisfy by construction."""
    for check in (_naming_problem, _function_problem, _number_problem, _properties_problem):
        problem = check(unit)
        if problem is not None:
            return problem
    return None


def _naming_problem(unit: PolicyUnit) -> str | None:
    if not isinstance(unit.name, str) or not _valid_name(unit.name):
        return f"name {unit.name!r} is not a unit name (a letter, then letters, digits, '_', '.', '-'; 64 at most)"
    if not isinstance(unit.description, str) or not isinstance(unit.summary, str):
        return "description and summary must be strings"
    return None


def _function_problem(unit: PolicyUnit) -> str | None:
    functions = {"filter": unit.filter, "weight": unit.weight, "balance": unit.balance}
    if all(fn is None for fn in functions.values()):
        return "has no filter, weight or balance function"
    for kind, fn in functions.items():
        if fn is not None and not callable(fn):
            return f"its {kind} is a {type(fn).__name__}, not a function"
    if not isinstance(unit.direction, Direction):
        return f"direction {unit.direction!r} is not a Direction"
    return None


def _number_problem(unit: PolicyUnit) -> str | None:
    for label, bound in (("minimum", unit.minimum), ("maximum", unit.maximum)):
        if bound is None:
            continue
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound):
            return f"{label} {bound!r} is not a finite number"
    return None


def _properties_problem(unit: PolicyUnit) -> str | None:
    if not isinstance(unit.properties, Mapping):
        return f"properties are a {type(unit.properties).__name__}, not a mapping of name to PropertySpec"
    for name, spec in unit.properties.items():
        problem = property_problem(name, spec)
        if problem is not None:
            return f"property {name!r}: {problem}"
    return None


def property_problem(name: object, spec: object) -> str | None:
    """Why a property spec cannot be used, or None. The regex gets the audit PropertySpec gives the
    built-ins when they are made: a spec can be made without it (object.__new__), so it runs again."""
    if not isinstance(name, str) or not _valid_name(name):
        return "is not a property name (a letter, then letters, digits, '_', '.', '-'; 64 at most)"
    if not isinstance(spec, PropertySpec):
        return f"is a {type(spec).__name__}, not a PropertySpec"
    problem = regex_problem(spec.regex)
    if problem is not None:
        return problem
    if spec.default is not None:
        if not isinstance(spec.default, str) or len(spec.default) > MAX_PROPERTY_VALUE:
            return f"default {spec.default!r} is not a string of at most {MAX_PROPERTY_VALUE} characters"
        if not spec.matches(spec.default):
            return f"default {spec.default!r} does not match its regex {spec.regex!r}"
    if not isinstance(spec.description, str):
        return "description must be a string"
    return None


def regex_problem(regex: object) -> str | None:
    """Why a property regex is unsafe to run on any value (regex_audit), or None."""
    if not isinstance(regex, str):
        return f"regex {regex!r} is not a string"
    try:
        re.compile(regex)
        why = ambiguity(regex)
    except re.error as exc:
        return f"regex {regex!r} does not compile: {exc}"
    except UnsupportedRegex as exc:
        return f"regex {regex!r} cannot be checked for backtracking: {exc}"
    if why is not None:
        return f"regex {regex!r} may backtrack super-linearly ({why}): one long value could hold a worker"
    return None


def _valid_name(name: str) -> bool:
    try:
        _NAME.validate_python(name)
    except ValidationError:
        return False
    return True


_A = TypeVar("_A")
_B = TypeVar("_B")
_R = TypeVar("_R")


def bounded(unit: PolicyUnit, origin: str, limit: CallLimit) -> PolicyUnit:
    """The unit with its origin set and every function held to the call limit."""

    def wrap(fn: Callable[[_A, _B, Props], _R] | None, step: str) -> Callable[[_A, _B, Props], _R] | None:
        return None if fn is None else _timed(fn, unit.name, origin, step, limit)

    return dataclasses.replace(
        unit,
        origin=origin,
        # Not taken on trust: a filter that reads other hosts would judge hosts it should not see.
        filter_by_row=False,
        filter=wrap(unit.filter, "filter"),
        weight=wrap(unit.weight, "weight"),
        balance=wrap(unit.balance, "balance"),
    )


def _timed(
    fn: Callable[[_A, _B, Props], _R], unit: str, origin: str, step: str, limit: CallLimit
) -> Callable[[_A, _B, Props], _R]:
    @functools.wraps(fn)
    def call(first: _A, second: _B, props: Props) -> _R:
        started = time.perf_counter()
        try:
            result = fn(first, second, props)
            if isinstance(result, FilterVerdict):
                # Its reasons are the plugin's code too: made now, timed and wrapped with the call.
                result = cast(_R, result.made())
        except VmschedError:
            raise
        except Exception as exc:
            raise SchedulingError(
                f"plugin unit {unit} ({origin}) failed in its {step} function: {_quote(exc)}", location=_LOCATION[step]
            ) from exc
        took = time.perf_counter() - started
        if took > limit.seconds:
            log.warning(
                "plugin unit over its call limit",
                unit=unit,
                origin=origin,
                step=step,
                took_s=took,
                limit_s=limit.seconds,
            )
            raise SchedulingError(
                f"plugin unit {unit} ({origin}) took {took:.3f} s in its {step} function, over the "
                f"{limit.seconds:g} s bound (VMSCHED_PLUGIN_CALL_LIMIT_S)",
                location=_LOCATION[step],
            )
        return result

    return call


__all__ = [
    "UNKNOWN_ORIGIN",
    "CallLimit",
    "EntryPoints",
    "LoadedPlugins",
    "RefusedPlugin",
    "bounded",
    "discover",
    "load_plugins",
    "origin_of",
    "property_problem",
    "regex_problem",
    "unit_problem",
]
