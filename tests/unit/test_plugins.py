"""Unit plugins: loading from the `vmsched.units` entry point group, what is refused and why, origins,
the per-call time bound, and the example package (examples/vmsched-example-units, installed by the
dev setup).

Broken plugins are not installed: each test hands the registry EntryPoint objects of its own through
its `entry_points` seam, naming objects defined here (or a module written to tmp_path).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from vmsched_example_units import RACK_LABEL_FILTER, RACK_SPREAD_WEIGHT, rack_label_filter, rack_spread_weight

import vmsched.scheduling.units as units_pkg
from tests.factories import host, kept, pend, reasons, table, vm
from vmsched.constants import UNIT_ENTRY_POINT_GROUP
from vmsched.contracts import VmSpec
from vmsched.errors import InvalidProperty, SchedulingError, UnknownPolicyUnit
from vmsched.scheduling.hosts import FloatArray, HostTable
from vmsched.scheduling.units import (
    BUILTIN_ORIGIN,
    BUILTIN_UNITS,
    REGISTRY,
    FilterVerdict,
    PolicyUnit,
    PropertySpec,
    Props,
    UnitRegistry,
    get_unit,
    validate_properties,
)
from vmsched.scheduling.units.filters import memory_filter
from vmsched.scheduling.units.plugins import UNKNOWN_ORIGIN, unit_problem
from vmsched.settings import Settings
from vmsched_services.tools.cli import main

EXAMPLE = "vmsched-example-units"
EXAMPLE_ORIGIN = f"{EXAMPLE} {metadata.version(EXAMPLE)}"
HERE = __name__  # "tests.unit.test_plugins": entry points below name objects of this module


def _keep_all(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    return FilterVerdict.keep_all(hosts)


def _flat(hosts: HostTable, vm: VmSpec, props: Props) -> FloatArray:
    return np.zeros(len(hosts))


def _sleepy(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    time.sleep(float(props.get("Nap", "0")))
    return FilterVerdict.keep_all(hosts)


def _broken(hosts: HostTable, vm: VmSpec, props: Props) -> FilterVerdict:
    raise KeyError("rack")


def _unchecked_spec(regex: str, default: str | None = None) -> PropertySpec:
    """A PropertySpec made without its own regex audit (as a careless or hostile plugin could)."""
    spec = object.__new__(PropertySpec)
    object.__setattr__(spec, "regex", regex)
    object.__setattr__(spec, "default", default)
    object.__setattr__(spec, "description", "")
    return spec


# Objects the entry points below name.
LONELY = PolicyUnit(name="LonelyFilter", description="keeps every host", filter=_keep_all)
PAIR = [
    PolicyUnit(name="PairFilter", description="", filter=_keep_all),
    PolicyUnit(name="PairWeight", description="", weight=_flat),
]
SHADOWS_MEMORY = PolicyUnit(name="Memory", description="a second Memory", filter=_keep_all)
TWIN_A = (
    PolicyUnit(name="Twin", description="", filter=_keep_all),
    PolicyUnit(name="NotATwin", description="", weight=_flat),
)
TWIN_B = PolicyUnit(name="Twin", description="", weight=_flat)
NOT_A_UNIT = 42
A_STRING = "RackLabelFilter"
EMPTY: list[PolicyUnit] = []
MIXED = [LONELY, {"name": "Dict"}]
BACKTRACKING = PolicyUnit(
    name="Backtracking", description="", filter=_keep_all, properties={"Zone": _unchecked_spec(r"^(a+)+$", "a")}
)
BACKREFERENCE = PolicyUnit(
    name="Backreference", description="", filter=_keep_all, properties={"Zone": _unchecked_spec(r"^(a)\1$")}
)
BAD_DEFAULT = PolicyUnit(
    name="BadDefault", description="", filter=_keep_all, properties={"Count": PropertySpec(r"^[0-9]+$", "many")}
)
BAD_NAME = PolicyUnit(name="has space", description="", filter=_keep_all)
NO_FUNCTION = PolicyUnit(name="NoFunction", description="")
SLEEPY = PolicyUnit(
    name="SleepyFilter", description="", filter=_sleepy, properties={"Nap": PropertySpec(r"^0\.[0-9]+$", "0.0")}
)
BROKEN = PolicyUnit(name="BrokenFilter", description="", filter=_broken)
#: The registry a plugin module written by a test reaches for while that very registry loads it.
BUILDING: list[UnitRegistry] = []


def ep(value: str, name: str = "test") -> metadata.EntryPoint:
    return metadata.EntryPoint(name=name, value=value, group=UNIT_ENTRY_POINT_GROUP)


def registry(*entry_points: metadata.EntryPoint, limit_s: float = 0.5) -> UnitRegistry:
    return UnitRegistry(BUILTIN_UNITS, entry_points=lambda: entry_points, call_limit_s=limit_s)


def refusal(reg: UnitRegistry, entry_point: str) -> list[str]:
    return [r.reason for r in reg.refused if r.entry_point.endswith(entry_point)]


def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


# ------------------------------------------------------------------------------ loading
def test_the_installed_example_package_is_loaded_with_its_origin() -> None:
    assert REGISTRY.refused == ()
    assert [u.name for u in REGISTRY.plugins] == ["RackLabelFilter", "RackSpreadWeight"]
    assert REGISTRY.origin("RackLabelFilter") == EXAMPLE_ORIGIN
    assert get_unit("RackSpreadWeight").origin == EXAMPLE_ORIGIN
    assert get_unit("RackSpreadWeight").kinds == ("weight",)
    assert REGISTRY.origin("Memory") == BUILTIN_ORIGIN
    assert all(u.origin == BUILTIN_ORIGIN for u in BUILTIN_UNITS)
    assert list(REGISTRY)[: len(BUILTIN_UNITS)] == [u.name for u in BUILTIN_UNITS]


def test_the_registry_is_built_on_first_use_and_loads_each_entry_point_once() -> None:
    calls: list[int] = []

    def found() -> Iterable[metadata.EntryPoint]:
        calls.append(1)
        return [ep(f"{HERE}:LONELY")]

    reg = UnitRegistry(BUILTIN_UNITS, entry_points=found)
    assert calls == []
    assert "LonelyFilter" in reg
    assert reg["Memory"] is get_unit("Memory")
    assert len(reg) == len(BUILTIN_UNITS) + 1
    assert calls == [1]


def test_an_entry_point_may_give_one_unit_or_a_sequence_and_its_units_get_their_origin() -> None:
    reg = registry(ep(f"{HERE}:LONELY", "one"), ep(f"{HERE}:PAIR", "two"), ep("vmsched_example_units:UNITS", "racks"))
    assert reg.refused == ()
    assert [u.name for u in reg.plugins] == [
        "LonelyFilter",
        "PairFilter",
        "PairWeight",
        "RackLabelFilter",
        "RackSpreadWeight",
    ]
    # A hand-made entry point has no distribution: it is found from the module's package.
    assert reg.origin("RackLabelFilter") == EXAMPLE_ORIGIN
    assert reg["RackLabelFilter"].properties == RACK_LABEL_FILTER.properties
    assert reg["RackLabelFilter"].description == RACK_LABEL_FILTER.description


def test_an_entry_point_outside_any_distribution_has_an_unknown_origin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = plugin_module(tmp_path, monkeypatch, "loose_units", f"from {HERE} import LONELY\n")
    assert registry(ep(f"{mod}:LONELY")).origin("LonelyFilter") == UNKNOWN_ORIGIN


def test_builtins_are_not_wrapped_and_plugins_are() -> None:
    assert REGISTRY["Memory"].filter is memory_filter
    assert REGISTRY["RackLabelFilter"].filter is not rack_label_filter
    assert REGISTRY["RackLabelFilter"].filter.__wrapped__ is rack_label_filter  # type: ignore[union-attr]


def test_every_builtin_meets_the_rules_plugins_are_held_to() -> None:
    """The plugin checks ask nothing of a plugin that vmsched's own units do not satisfy."""
    assert {u.name: unit_problem(u) for u in BUILTIN_UNITS} == {u.name: None for u in BUILTIN_UNITS}


# ------------------------------------------------------------------------------ refusals
def test_a_unit_named_like_a_builtin_is_refused_and_the_builtin_stays() -> None:
    reg = registry(ep(f"{HERE}:SHADOWS_MEMORY", "shadow"))
    assert reg["Memory"] is get_unit("Memory")
    assert reg["Memory"].origin == BUILTIN_ORIGIN
    [r] = reg.refused
    assert (r.entry_point, r.unit) == (f"shadow = {HERE}:SHADOWS_MEMORY", "Memory")
    assert r.reason == "the name Memory is a built-in unit's"


def test_a_name_two_plugins_claim_is_refused_to_both_and_their_other_units_load() -> None:
    reg = registry(ep(f"{HERE}:TWIN_A", "a"), ep(f"{HERE}:TWIN_B", "b"))
    assert "Twin" not in reg
    assert reg.origin("NotATwin") == UNKNOWN_ORIGIN
    assert sorted((r.entry_point[0], r.unit) for r in reg.refused) == [("a", "Twin"), ("b", "Twin")]
    assert all("also claimed by" in r.reason for r in reg.refused)
    assert f"'b = {HERE}:TWIN_B'" in refusal(reg, ":TWIN_A")[0]
    # the same in the other order: the outcome does not depend on which package is found first
    again = registry(ep(f"{HERE}:TWIN_B", "b"), ep(f"{HERE}:TWIN_A", "a"))
    assert sorted(again) == sorted(reg)


def test_one_unit_listed_twice_by_its_entry_point_is_refused() -> None:
    reg = registry(ep(f"{HERE}:LONELY", "x"), ep(f"{HERE}:LONELY", "y"))
    assert "LonelyFilter" not in reg
    assert len(reg.refused) == 2


def test_an_entry_point_that_fails_to_import_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    boom = plugin_module(tmp_path, monkeypatch, "boom_units", "raise RuntimeError('no database here')\n")
    leaves = plugin_module(tmp_path, monkeypatch, "exit_units", "import sys\nsys.exit(3)\n")
    reg = registry(
        ep("vmsched_no_such_package:UNITS", "missing"),
        ep(f"{boom}:UNITS", "boom"),
        ep(f"{leaves}:UNITS", "exits"),
        ep(f"{HERE}:NO_SUCH_NAME", "attr"),
    )
    assert refusal(reg, "vmsched_no_such_package:UNITS") == [
        "failed to load: ModuleNotFoundError: No module named 'vmsched_no_such_package'"
    ]
    assert refusal(reg, f"{boom}:UNITS") == ["failed to load: RuntimeError: no database here"]
    assert refusal(reg, f"{leaves}:UNITS") == ["failed to load: SystemExit: 3"]
    assert refusal(reg, f"{HERE}:NO_SUCH_NAME")[0].startswith("failed to load: AttributeError: ")
    assert all(r.package == UNKNOWN_ORIGIN and r.unit is None for r in reg.refused)
    assert len(reg) == len(BUILTIN_UNITS)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("NOT_A_UNIT", "gave a int, not a PolicyUnit or a sequence of them"),
        ("A_STRING", "gave a str, not a PolicyUnit or a sequence of them"),
        ("EMPTY", "gave an empty sequence: no units"),
        ("MIXED", "gave a sequence holding a dict at position 1, not a PolicyUnit"),
    ],
)
def test_an_entry_point_giving_anything_but_units_is_refused_whole(name: str, reason: str) -> None:
    reg = registry(ep(f"{HERE}:{name}"))
    assert refusal(reg, f":{name}") == [reason]
    assert "LonelyFilter" not in reg


def test_a_property_regex_that_can_backtrack_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Made in the plugin's module, the spec's own audit stops the import; smuggled past it, the
    # registry's audit refuses the unit.
    eager = plugin_module(
        tmp_path,
        monkeypatch,
        "eager_units",
        "from vmsched.scheduling.units import PropertySpec\nCOUNT = PropertySpec(r'^[0-9]*[1-9][0-9]*$', None)\n",
    )
    reg = registry(ep(f"{eager}:UNITS"), ep(f"{HERE}:BACKTRACKING"), ep(f"{HERE}:BACKREFERENCE"))
    [at_import] = refusal(reg, f"{eager}:UNITS")
    assert at_import.startswith(
        "failed to load: ValueError: property regex '^[0-9]*[1-9][0-9]*$' may backtrack super-linearly"
    )
    [smuggled] = refusal(reg, ":BACKTRACKING")
    assert smuggled.startswith("property 'Zone': regex '^(a+)+$' may backtrack super-linearly (")
    [unjudged] = refusal(reg, ":BACKREFERENCE")
    assert unjudged.startswith("property 'Zone': regex '^(a)\\\\1$' cannot be checked for backtracking")
    assert "Backtracking" not in reg
    assert "Backreference" not in reg


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("BAD_DEFAULT", "property 'Count': default 'many' does not match its regex '^[0-9]+$'"),
        ("BAD_NAME", "name 'has space' is not a unit name"),
        ("NO_FUNCTION", "has no filter, weight or balance function"),
    ],
)
def test_a_unit_the_builtins_could_not_be_is_refused(name: str, reason: str) -> None:
    reg = registry(ep(f"{HERE}:{name}"), ep(f"{HERE}:LONELY", "fine"))
    [r] = reg.refused
    assert r.reason.startswith(reason)
    assert r.unit == getattr(__import__(HERE, fromlist=[name]), name).name
    assert "LonelyFilter" in reg


def test_a_plugin_using_the_registry_while_it_loads_is_refused_not_deadlocked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mod = plugin_module(
        tmp_path,
        monkeypatch,
        "eager_lookup",
        f"from {HERE} import BUILDING, LONELY\nBUILDING[0]['Memory']\nUNITS = [LONELY]\n",
    )
    reg = registry(ep(f"{mod}:UNITS"))
    BUILDING[:] = [reg]
    try:
        [reason] = refusal(reg, f"{mod}:UNITS")
    finally:
        BUILDING.clear()
    assert "a plugin must not use it while it loads" in reason
    assert reg["Memory"] is get_unit("Memory")


def test_refused_plugins_leave_a_working_registry_and_are_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    boom = plugin_module(tmp_path, monkeypatch, "boom_again", "raise ImportError('numpy too old')\n")
    bad = [f"{HERE}:{n}" for n in ("NOT_A_UNIT", "SHADOWS_MEMORY", "BACKTRACKING", "TWIN_A", "TWIN_B")]
    reg = registry(*(ep(v, f"e{i}") for i, v in enumerate([*bad, f"{boom}:UNITS", f"{HERE}:PAIR"])))
    capsys.readouterr()
    names = list(reg)
    assert names == [*(u.name for u in BUILTIN_UNITS), "NotATwin", "PairFilter", "PairWeight"]
    assert [u.name for u in reg.plugins] == ["NotATwin", "PairFilter", "PairWeight"]
    assert get_unit("Memory", reg).filter is memory_filter
    with pytest.raises(UnknownPolicyUnit):
        get_unit("Twin", reg)
    # not a unit, Memory, Backtracking, Twin (twice: both claimants), the import error
    assert len(reg.refused) == 6
    logged = capsys.readouterr().err.splitlines()
    assert len(logged) == 6
    for line, r in zip(logged, reg.refused, strict=True):
        assert "[warning  ] plugin refused" in line
        assert f"entry_point={r.entry_point!r}" in line
        assert f"reason={r.reason!r}" in line
        assert f"package={r.package}" in line
    list(reg)
    assert reg.refused
    assert capsys.readouterr().err == ""


def test_unreadable_entry_points_leave_the_builtins() -> None:
    def unreadable() -> Iterable[metadata.EntryPoint]:
        raise OSError("metadata directory vanished")

    reg = UnitRegistry(BUILTIN_UNITS, entry_points=unreadable)
    assert list(reg) == [u.name for u in BUILTIN_UNITS]
    [r] = reg.refused
    assert r.reason == "the entry points could not be read: metadata directory vanished"


# ------------------------------------------------------------------------------ the time bound
def test_a_plugin_call_over_the_limit_fails_naming_unit_time_and_bound(capsys: pytest.CaptureFixture[str]) -> None:
    reg = registry(ep(f"{HERE}:SLEEPY"), limit_s=0.05)
    unit = reg["SleepyFilter"]
    assert unit.filter is not None
    hosts = table(host("h1"), host("h2"))
    assert kept(hosts, unit.filter(hosts, vm(), validate_properties(unit, {"Nap": "0.0"}))) == ["h1", "h2"]
    capsys.readouterr()
    with pytest.raises(SchedulingError) as info:
        unit.filter(hosts, vm(), validate_properties(unit, {"Nap": "0.12"}))
    message = str(info.value)
    assert message.startswith(f"filters: plugin unit SleepyFilter ({reg.origin('SleepyFilter')}) took ")
    took = float(message.split(" took ")[1].split(" s ")[0])
    assert took >= 0.12  # the nap it was asked for; a busy machine only makes it longer
    assert message.endswith("over the 0.05 s bound (VMSCHED_PLUGIN_CALL_LIMIT_S)")
    assert info.value.location == "filters"
    [warning] = capsys.readouterr().err.splitlines()
    assert "plugin unit over its call limit" in warning
    for field in ("unit=SleepyFilter", "limit_s=0.05", "step=filter"):
        assert field in warning


def test_the_limit_follows_the_settings_a_service_loads_the_registry_with() -> None:
    reg = registry(ep(f"{HERE}:SLEEPY"), limit_s=5.0)
    unit = reg["SleepyFilter"]
    assert unit.filter is not None
    hosts = table(host("h1"))
    unit.filter(hosts, vm(), {"Nap": "0.06"})
    reg.load(Settings(plugin_call_limit_s=0.02))
    assert reg.call_limit_s == 0.02
    with pytest.raises(SchedulingError, match=r"over the 0\.02 s bound"):
        unit.filter(hosts, vm(), {"Nap": "0.06"})


def test_a_plugin_exception_becomes_a_scheduling_error_naming_the_unit() -> None:
    reg = registry(ep(f"{HERE}:BROKEN"))
    unit = reg["BrokenFilter"]
    assert unit.filter is not None
    with pytest.raises(SchedulingError) as info:
        unit.filter(table(host("h1")), vm(), {})
    assert (
        str(info.value)
        == f"filters: plugin unit BrokenFilter ({UNKNOWN_ORIGIN}) failed in its filter function: KeyError: 'rack'"
    )
    assert isinstance(info.value.__cause__, KeyError)


def test_a_plugin_property_is_validated_like_a_builtin_one() -> None:
    unit = REGISTRY["RackLabelFilter"]
    assert validate_properties(unit, {}) == {"RackLabel": "rack"}
    assert validate_properties(unit, {"RackLabel": "row"}) == {"RackLabel": "row"}
    with pytest.raises(InvalidProperty):
        validate_properties(unit, {"RackLabel": "no spaces"})


# ------------------------------------------------------------------------------ the example units
def _racks(*racks: str | None) -> HostTable:
    return table(*(host(f"h{i}", labels={} if r is None else {"rack": r}) for i, r in enumerate(racks)))


def test_rack_label_filter_keeps_the_vm_in_its_racks_with_a_reason_per_removed_host() -> None:
    hosts = _racks("r1", "r2", "r3", None)
    verdict = rack_label_filter(hosts, vm(extra_specs={"rack:allowed": "r2, r1"}), {"RackLabel": "rack"})
    assert kept(hosts, verdict) == ["h0", "h1"]
    assert reasons(hosts, verdict) == {
        "h2": "rack 'r3' is not one of the VM's racks 'r1', 'r2'",
        "h3": "no 'rack' label; the VM runs only in rack 'r1', 'r2'",
    }


def test_rack_label_filter_keeps_every_host_for_a_vm_that_names_no_rack() -> None:
    hosts = _racks("r1", None)
    assert kept(hosts, rack_label_filter(hosts, vm(), {"RackLabel": "rack"})) == ["h0", "h1"]
    assert kept(hosts, rack_label_filter(hosts, vm(extra_specs={"rack:allowed": " , "}), {})) == ["h0", "h1"]


def test_rack_label_filter_reads_the_label_the_policy_names() -> None:
    hosts = table(host("h0", labels={"row": "A"}), host("h1", labels={"row": "B", "rack": "A"}))
    assert kept(hosts, rack_label_filter(hosts, vm(extra_specs={"rack:allowed": "A"}), {"RackLabel": "row"})) == ["h0"]


def test_rack_spread_weight_counts_running_and_pending_vms_of_the_whole_rack() -> None:
    states = [
        host("h0", labels={"rack": "r1"}, vm_count=3),
        host("h1", labels={"rack": "r1"}, vm_count=1),
        host("h2", labels={"rack": "r2"}, vm_count=2),
        host("h3", labels={}, vm_count=1),
    ]
    whole = table(*states, pending=[pend("h2"), pend("h2"), pend("h3")])
    # Only h1..h3 are still in play; h0's VMs count for its rack all the same.
    weights = rack_spread_weight(whole.subset(["h1", "h2", "h3"]), vm(), {"RackLabel": "rack"})
    assert weights.tolist() == [4.0, 4.0, 2.0]


def test_the_example_units_are_pure() -> None:
    """Same arguments, same answer; the table is not changed."""
    hosts = _racks("r1", "r2", None)
    spec = vm(extra_specs={"rack:allowed": "r2"})
    before = [dict(labels) for labels in hosts.labels]
    first = rack_label_filter(hosts, spec, {"RackLabel": "rack"})
    again = rack_label_filter(hosts, spec, {"RackLabel": "rack"})
    assert first.keep.tolist() == again.keep.tolist()
    assert list(first.reasons) == list(again.reasons)
    assert rack_spread_weight(hosts, spec, {}).tolist() == rack_spread_weight(hosts, spec, {}).tolist()
    assert [dict(labels) for labels in hosts.labels] == before
    assert RACK_SPREAD_WEIGHT.weight is rack_spread_weight


# ------------------------------------------------------------------------------ vmsched units list
def test_units_list_shows_origins_and_the_refused_plugins(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = registry(ep("vmsched_example_units:UNITS", "racks"), ep(f"{HERE}:SHADOWS_MEMORY", "shadow"))
    monkeypatch.setattr(units_pkg, "REGISTRY", reg)
    assert main(["units", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "kinds", "origin", "description"]
    rack = next(line for line in lines if line.startswith("RackLabelFilter "))
    assert rack.split()[1:4] == ["filter", *EXAMPLE_ORIGIN.split()]
    assert next(line for line in lines if line.startswith("Memory ")).split()[1:3] == ["filter", "builtin"]
    at = lines.index("refused plugins (1), not loaded:")
    assert lines[at + 1] == (
        f"  unit Memory of {UNKNOWN_ORIGIN} entry point 'shadow = {HERE}:SHADOWS_MEMORY': "
        "the name Memory is a built-in unit's"
    )


def test_units_list_json_carries_each_units_origin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(units_pkg, "REGISTRY", registry(ep("vmsched_example_units:UNITS", "racks")))
    assert main(["units", "list", "--json"]) == 0
    origins = {u["name"]: u["origin"] for u in json.loads(capsys.readouterr().out)}
    assert origins["RackSpreadWeight"] == EXAMPLE_ORIGIN
    assert origins["Memory"] == BUILTIN_ORIGIN
