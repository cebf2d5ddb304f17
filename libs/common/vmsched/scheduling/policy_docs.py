"""Policies as administrators write them: documents to and from `Policy`, whole-document validation
with suggestions, and readable diffs. Pure: the policy-admin service, the CLI's dry runs and the
tests all use these.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from uuid import UUID

from vmsched.contracts.policies import (
    ClusterAttachment,
    FilterEntry,
    FilterPosition,
    PolicyDocument,
    WeightEntry,
)
from vmsched.scheduling.budgets import BUDGET_PROPERTIES, BUDGETS
from vmsched.scheduling.policy import FilterSequence, Policy, PolicyFilter, PolicyWeight
from vmsched.scheduling.selection import SELECTORS
from vmsched.scheduling.units.base import PolicyUnit, PropertySpec

_TO_SEQUENCE = {FilterPosition.FIRST: FilterSequence.FIRST, FilterPosition.ANY: FilterSequence.NONE}
_TO_SEQUENCE[FilterPosition.LAST] = FilterSequence.LAST
_TO_POSITION = {v: k for k, v in _TO_SEQUENCE.items()}

#: Which running services must have a unit, by what a policy uses it for (the filter-worker places
#: whole groups by default, so it weighs too; the weigher weighs when the selector places).
SERVICES_BY_USE: Mapping[str, tuple[str, ...]] = {
    "filter": ("filter-worker",),
    "weight": ("filter-worker", "weigher"),
    "balance": ("balancer",),
}


# ------------------------------------------------------------------------------------ conversion
def document_of(policy: Policy) -> PolicyDocument:
    """The policy as an administrator writes it."""
    return PolicyDocument(
        name=policy.name,
        description=policy.description,
        filters=[FilterEntry(unit=f.unit, position=_TO_POSITION[f.sequence]) for f in policy.filters],
        weights=[WeightEntry(unit=w.unit, factor=w.factor) for w in policy.weights],
        balance=policy.balance,
        selector=policy.selector,
        properties=dict(policy.properties),
    )


def policy_of(doc: PolicyDocument, policy_id: UUID) -> Policy:
    """The Policy a (validated) document stores as; never locked or default (those are the store's)."""
    return Policy(
        id=policy_id,
        name=doc.name,
        description=doc.description,
        filters=tuple(PolicyFilter(unit=f.unit, sequence=_TO_SEQUENCE[f.position]) for f in doc.filters),
        weights=tuple(PolicyWeight(unit=w.unit, factor=w.factor) for w in doc.weights),
        balance=doc.balance,
        selector=doc.selector,
        properties=dict(doc.properties),
    )


# ------------------------------------------------------------------------------------ validation
def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not close:
        lowered = {k.lower(): k for k in known}
        if name.lower() in lowered:
            close = [lowered[name.lower()]]
    return f"; did you mean {close[0]!r}?" if close else ""


#: Integers tried when putting a numeric property's regex into words.
_PROBE_MAX = 10_000
_WORDS = re.compile(r"^\^\(([A-Za-z0-9_.-]+(?:\|[A-Za-z0-9_.-]+)+)\)\$$")


@functools.lru_cache(maxsize=1024)
def expected(regex: str) -> str | None:
    """A property regex in words when it has a common shape ("a whole number from 50 to 99",
    "true or false"); None otherwise. Integer regexes are recognised by trying them, so the words
    say what the regex really accepts, not a reading of its syntax."""
    pattern = re.compile(regex.removeprefix("^").removesuffix("$"))
    words = _WORDS.match(regex)
    if words:
        options = words.group(1).split("|")
        return " or ".join(options) if len(options) == 2 else "one of " + ", ".join(options)
    if any(pattern.fullmatch(x) for x in ("", "-1", "1.5", "x", "true")):
        return None
    accepted = [n for n in range(_PROBE_MAX + 1) if pattern.fullmatch(str(n))]
    if not accepted or accepted != list(range(accepted[0], accepted[-1] + 1)):
        return None
    if accepted[-1] == _PROBE_MAX:
        return f"a whole number of at least {accepted[0]}"
    return f"a whole number from {accepted[0]} to {accepted[-1]}"


def _property_problem(unit: PolicyUnit, name: str, spec: PropertySpec, value: str) -> str:
    return _property_problem_of(unit.name, name, spec, value)


def _property_problem_of(reader: str, name: str, spec: PropertySpec, value: str) -> str:
    what = f" ({spec.description})" if spec.description else ""
    words = expected(spec.regex)
    rule = f"{name} must be {words}" if words else f"{name} must match {spec.regex}"
    default = f" (default {spec.default})" if spec.default is not None else ""
    return f"{rule}{default}, not {value!r}: {reader} reads it{what}"


def problems(
    doc: PolicyDocument,
    registry: Mapping[str, PolicyUnit],
    *,
    available: Mapping[str, frozenset[str]] | None = None,
) -> list[str]:
    """Everything wrong with the document, each with what to do about it (empty: valid).

    `available`: the units each kind of running service has (service name -> unit names); a unit a
    running service lacks is refused, so a policy cannot be saved that some worker would fail on.
    """
    found: list[str] = []
    uses: list[tuple[str, str]] = [("filter", f.unit) for f in doc.filters] + [("weight", w.unit) for w in doc.weights]
    if doc.balance is not None:
        uses.append(("balance", doc.balance))
    for use in ("filter", "weight"):
        names = [n for u, n in uses if u == use]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            found.append(f"{use} units listed twice: {', '.join(twice)}")
    units: list[PolicyUnit] = []
    for use, name in uses:
        unit = registry.get(name)
        if unit is None:
            found.append(f"unknown {use} unit {name!r}{_suggest(name, registry)}")
            continue
        if use not in unit.kinds:
            can = " or ".join(unit.kinds)
            found.append(f"{name} is not a {use} unit (it is a {can} unit)")
            continue
        units.append(unit)
        for service in SERVICES_BY_USE[use]:
            have = (available or {}).get(service)
            if have is not None and name not in have:
                found.append(f"{use} unit {name} is not available in the running {service} (is its plugin installed?)")
    if doc.selector not in SELECTORS:
        found.append(f"unknown selector {doc.selector!r}{_suggest(doc.selector, SELECTORS)}")
    found += property_problems(doc.properties, units)
    return found


def property_problems(properties: Mapping[str, str], units: Iterable[PolicyUnit]) -> list[str]:
    """Properties no unit of the policy reads (a misspelling, most likely), and values a unit refuses."""
    units = list(units)
    declared: dict[str, list[tuple[PolicyUnit, PropertySpec]]] = {}
    for unit in units:
        for name, spec in unit.properties.items():
            declared.setdefault(name, []).append((unit, spec))
    # Whatever balances, the disruption budgets bound its migrations: they read their own properties.
    balances = any("balance" in unit.kinds for unit in units)
    budgets = BUDGET_PROPERTIES if balances else {}
    found: list[str] = []
    for name, value in sorted(properties.items()):
        if name in budgets:
            if not budgets[name].matches(value):
                found.append(_property_problem_of(BUDGETS, name, budgets[name], value))
            continue
        readers = declared.get(name)
        if readers is None:
            known = {**declared, **budgets}
            found.append(f"property {name!r} is not read by any unit of the policy{_suggest(name, known)}")
            continue
        for unit, spec in readers:
            if not spec.matches(value):
                found.append(_property_problem(unit, name, spec, value))
                break
    return found


def policy_units(policy: Policy | PolicyDocument, registry: Mapping[str, PolicyUnit]) -> list[PolicyUnit]:
    """The registry's units a policy uses (those it knows)."""
    names = [f.unit for f in policy.filters] + [w.unit for w in policy.weights]
    if policy.balance is not None:
        names.append(policy.balance)
    return [registry[n] for n in dict.fromkeys(names) if n in registry]


# ------------------------------------------------------------------------------------ diffs
def diff(old: PolicyDocument | None, new: PolicyDocument) -> list[str]:
    """What changes from `old` to `new`, one readable line each (everything, for a new policy)."""
    before = old or PolicyDocument(name=new.name)
    lines: list[str] = []
    for field in ("description", "selector", "balance"):
        a, b = getattr(before, field), getattr(new, field)
        if a != b and (old is not None or b):
            lines.append(f"~ {field}: {a!r} -> {b!r}" if old is not None else f"+ {field}: {b!r}")
    old_filters = [(f.unit, f.position.value) for f in before.filters]
    new_filters = [(f.unit, f.position.value) for f in new.filters]
    if old_filters != new_filters:
        gone = [u for u, _ in old_filters if u not in {n for n, _ in new_filters}]
        lines += [f"- filter {u}" for u in gone]
        lines += [f"+ filter {u} ({p})" for u, p in new_filters if u not in {n for n, _ in old_filters}]
        kept_old = [t for t in old_filters if t[0] not in gone]
        kept_new = [t for t in new_filters if t[0] in {n for n, _ in old_filters}]
        if kept_old != kept_new:
            lines.append("~ filter order: " + ", ".join(f"{u} ({p})" for u, p in new_filters))
    old_w = {w.unit: w.factor for w in before.weights}
    new_w = {w.unit: w.factor for w in new.weights}
    lines += [f"- weight {u}" for u in old_w if u not in new_w]
    lines += [f"+ weight {u} factor {f}" for u, f in new_w.items() if u not in old_w]
    lines += [f"~ weight {u} factor {old_w[u]} -> {f}" for u, f in new_w.items() if u in old_w and old_w[u] != f]
    lines += _mapping_diff("property", before.properties, new.properties)
    return lines


def attachment_diff(old: ClusterAttachment | None, new: ClusterAttachment) -> list[str]:
    """What changes in a cluster's attachment."""
    if old is None:
        lines = [f"+ policy {new.policy}"]
        if new.ha_reservation:
            lines.append("+ ha_reservation")
        return lines + _mapping_diff("property", {}, new.properties)
    lines = []
    if old.policy != new.policy:
        lines.append(f"~ policy {old.policy} -> {new.policy}")
    if old.ha_reservation != new.ha_reservation:
        lines.append(f"~ ha_reservation {old.ha_reservation} -> {new.ha_reservation}")
    return lines + _mapping_diff("property", old.properties, new.properties)


def _mapping_diff(what: str, old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    lines = [f"- {what} {k}" for k in sorted(old) if k not in new]
    lines += [f"+ {what} {k} = {new[k]!r}" for k in sorted(new) if k not in old]
    lines += [f"~ {what} {k}: {old[k]!r} -> {new[k]!r}" for k in sorted(new) if k in old and old[k] != new[k]]
    return lines


__all__ = [
    "SERVICES_BY_USE",
    "attachment_diff",
    "diff",
    "document_of",
    "expected",
    "policy_of",
    "policy_units",
    "problems",
    "property_problems",
]
