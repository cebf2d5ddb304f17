"""Every input that reaches a unit is bounded, numbers are strict, property regexes are linear.

Each hostile input here once passed validation and then held a worker for seconds (a 3.3 MB
JsonFilter query, a 2 MB extra-spec requirement, a 48k-character allocation ratio that backtracked
quadratically) or grew its memory (distinct 1 MB property values in the validation cache). No test
here times anything: each asserts the input is refused by a bound, and where, before the costly step.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from tests.factories import host, table, vm
from vmsched.bus.codec import decode
from vmsched.contracts import (
    ClusterReport,
    FilterRequest,
    HostReport,
    HostState,
    ScheduleRequest,
    UnitCall,
    VmSpec,
    WeighRequest,
)
from vmsched.contracts.base import (
    MAX_EXTRA_SPECS,
    MAX_IMAGE_PROPERTY_VALUE,
    MAX_PROPERTY_VALUE,
    MAX_QUERY_DEPTH,
    MAX_QUERY_NODES,
    MAX_TEXT,
)
from vmsched.errors import InvalidProperty, InvalidRequest, PropertyTooLong, UnsupportedRegex
from vmsched.scheduling.pipeline import run_filters, run_weights
from vmsched.scheduling.policy import Policy
from vmsched.scheduling.units.base import PropertySpec, ValidationCache, validate_properties
from vmsched.scheduling.units.extra_specs import lookup
from vmsched.scheduling.units.nova_resource_filters import RAM_RATIO
from vmsched.scheduling.units.regex_audit import ambiguity
from vmsched.scheduling.units.registry import REGISTRY
from vmsched.store.state_records import MAX_TRUSTED_BYTES, parse_stored
from vmsched_services.tools.asyncapi import ALL_MODELS

#: A value built to make a backtracking regex over digits work hardest: digits, then a mismatch.
HOSTILE = "0." + "1" * 100_000 + "x"


def _vm(**kw: Any) -> dict[str, Any]:
    return {"vm_id": "vm1", "mem_mb": 1024, "vcpus": 2, **kw}


def _filter_request(vm_fields: dict[str, Any] | None = None, filters: list[dict[str, Any]] | None = None) -> bytes:
    body = {
        "request_id": str(uuid.uuid4()),
        "cluster_id": "c1",
        "state_version": 0,
        "vm": _vm(**(vm_fields or {})),
        "candidates": ["h1", "h2"],
        "filters": filters if filters is not None else [{"unit": "JsonFilter"}],
    }
    return json.dumps(body).encode()


def _refused(body: bytes, model: type[Any] = FilterRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as err:
        decode(body, model, max_bytes=4 * 1024 * 1024)
    return err.value


# ------------------------------------------------------------------------------ strict numbers
def _lax_numbers(node: Any, path: str, out: list[str], *, key: bool = False) -> None:
    """Paths of int/float/bool schemas (dict keys excepted: JSON keys are strings) that are not strict."""
    if isinstance(node, dict):
        if node.get("type") in ("int", "float", "bool") and not key and not node.get("strict"):
            out.append(path)
        for k, v in node.items():
            if k not in ("cls", "metadata", "serialization"):
                _lax_numbers(v, f"{path}/{k}", out, key=k == "keys_schema")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _lax_numbers(v, f"{path}[{i}]", out)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_every_number_and_boolean_field_is_strict(model: Any) -> None:
    lax: list[str] = []
    _lax_numbers(model.__pydantic_core_schema__, model.__name__, lax)
    assert lax == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mem_mb", True),  # lax mode made this 1 MB
        ("vcpus", True),
        ("mem_mb", "1024"),
        ("vcpus", 2.0),
        ("cpu_usage_pct", True),
        ("ha", 1),
        ("use_swap", "false"),
    ],
)
def test_json_of_the_wrong_type_is_refused_naming_the_field(field: str, value: Any) -> None:
    body = json.dumps({"request_id": str(uuid.uuid4()), "cluster_id": "c1", "vm": _vm(**{field: value})}).encode()
    err = _refused(body, ScheduleRequest)
    assert err.location == f"vm.{field}"


def test_legitimate_json_still_decodes() -> None:
    """A float field takes a JSON integer; datetimes, UUIDs and enums come as JSON strings."""
    request_id = uuid.uuid4()
    body = json.dumps(
        {
            "request_id": str(request_id),
            "cluster_id": "c1",
            "kind": "run",
            "deadline": "2030-01-01T00:00:00Z",
            "vm": _vm(cpu_usage_pct=50, affinity_groups=[{"group_id": "g", "priority": 2}]),
        }
    ).encode()
    req = decode(body, ScheduleRequest)
    assert req.request_id == request_id
    assert req.vm.cpu_usage_pct == 50.0
    assert isinstance(req.vm.cpu_usage_pct, float)
    assert req.vm.affinity_groups[0].priority == 2.0
    assert req.deadline is not None
    assert req.deadline.year == 2030
    report = HostReport.model_validate_json(
        json.dumps(
            {
                "cluster_id": "c1",
                "host_id": "h1",
                "status": "up",
                "cpu_cores": 8,
                "physical_mem_mb": 4096,
                "mem_free_mb": 4096,
                "cpu_usage_pct": 5,
                "hugepages_free": {"2048": 16},
                "metrics": {"cpu.percent": 12},
                "reported_at": "2030-01-01T00:00:00+00:00",
            }
        )
    )
    assert report.hugepages_free == {2048: 16}
    assert report.metrics == {"cpu.percent": 12.0}


def test_a_weight_factor_from_json_may_be_an_integer_but_not_a_boolean() -> None:
    assert UnitCall.model_validate_json('{"unit": "X", "factor": 2}').factor == 2.0
    with pytest.raises(ValidationError):
        UnitCall.model_validate_json('{"unit": "X", "factor": true}')


# ------------------------------------------------------------------------- every string bounded
def _unbounded(node: Any, path: str, out: list[str], *, key: bool = False) -> None:
    if isinstance(node, dict):
        kind = node.get("type")
        if kind in ("str", "list", "dict") and node.get("max_length") is None and not key:
            out.append(path)
        if kind == "int" and node.get("le") is None and not key:
            out.append(path)
        for k, v in node.items():
            if k not in ("cls", "metadata", "serialization"):
                _unbounded(v, f"{path}/{k}", out, key=k == "keys_schema")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _unbounded(v, f"{path}[{i}]", out)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_every_string_list_map_and_integer_of_a_message_is_bounded(model: Any) -> None:
    found: list[str] = []
    _unbounded(model.__pydantic_core_schema__, model.__name__, found)
    # The JsonFilter query is a list of anything: bounded by its validator (tests below), not a
    # schema length; ErrorReply.location belongs to the bus's error reply.
    allowed = re.compile(r"/fields/query/|^ErrorReply/.*/location/")
    assert [p for p in found if not allowed.search(p)] == []


# ------------------------------------------------------------------------------- JsonFilter query
def test_a_huge_jsonfilter_query_is_refused_at_decode_naming_the_field() -> None:
    query = ["and", *([">=", "$free_ram_mb", i] for i in range(100_000))]
    err = _refused(_filter_request({"query": query}))
    assert err.location == "vm.query"
    assert f"more than {MAX_QUERY_NODES} JSON nodes" in err.message


def test_a_deep_jsonfilter_query_is_refused() -> None:
    query: list[Any] = [">=", "$free_ram_mb", 1]
    for _ in range(MAX_QUERY_DEPTH + 1):
        query = ["not", query]
    err = _refused(_filter_request({"query": query}))
    assert err.location == "vm.query"
    assert f"nested deeper than {MAX_QUERY_DEPTH} levels" in err.message


@pytest.mark.parametrize(
    ("query", "says"),
    [
        (["=", "$host", "x" * 1_000_000], "string of 1000000 characters at [2]"),
        ([">=", "$free_ram_mb", 10**400], "integer at [2] does not fit in 64 bits"),
        (["and", {"k" * 300: 1}], "key of 300 characters"),
    ],
)
def test_jsonfilter_query_strings_and_numbers_are_bounded(query: list[Any], says: str) -> None:
    err = _refused(_filter_request({"query": query}))
    assert err.location == "vm.query"
    assert says in err.message


def test_a_query_at_the_bounds_is_accepted_and_runs() -> None:
    # ["or", [...] x 63] = 1 + 63 * 4 = 253 nodes, every string short, nesting 2.
    query = ["or", *([">=", "$free_ram_mb", i] for i in range(63))]
    req = decode(_filter_request({"query": query}), FilterRequest)
    out = run_filters(table(host("h1"), host("h2")), req.vm, req.filters)
    assert list(out.survivors.ids) == ["h1", "h2"]


# ----------------------------------------------------------------------------------- extra specs
def test_a_megabyte_extra_spec_requirement_is_refused_naming_the_key() -> None:
    requirement = "<or> " + "x <or> " * 290_000
    err = _refused(_filter_request({"extra_specs": {"capabilities:cpu_info:vendor": requirement}}))
    assert err.location == "vm.extra_specs.capabilities:cpu_info:vendor"


def test_extra_spec_keys_and_count_are_bounded() -> None:
    err = _refused(_filter_request({"extra_specs": {"k" * 256: "1"}}))
    assert err.location is not None
    assert err.location.startswith("vm.extra_specs.")
    many = {f"capabilities:k{i}": "1" for i in range(MAX_EXTRA_SPECS + 1)}
    err = _refused(_filter_request({"extra_specs": many}))
    assert err.location == "vm.extra_specs"
    fits = {f"capabilities:k{i}": "1" for i in range(MAX_EXTRA_SPECS)}
    assert len(decode(_filter_request({"extra_specs": fits}), FilterRequest).vm.extra_specs) == MAX_EXTRA_SPECS


def test_image_properties_are_bounded() -> None:
    err = _refused(_filter_request({"image_properties": {"hypervisor_version_requires": ">=1," * 100_000}}))
    assert err.location == "vm.image_properties.hypervisor_version_requires"


# -------------------------------------------------------------------------------- host reports
def _report(**kw: Any) -> bytes:
    body = {"cluster_id": "c1", "host_id": "h1", "status": "up", "cpu_cores": 4, "physical_mem_mb": 1, "mem_free_mb": 1}
    return json.dumps({**body, **kw}).encode()


@pytest.mark.parametrize(
    ("fields", "location"),
    [
        ({"labels": {"rack": "r" * 1_000_000}}, "labels.rack"),
        ({"labels": {"k" * 300: "1"}}, "labels."),
        ({"metrics": {"m" * 300: 1.0}}, "metrics."),
        ({"cpu_models": ["x" * 200]}, "cpu_models.0"),
        ({"capabilities": {"cpu_info": "x" * 100_000}}, "capabilities"),
        ({"capabilities": {"a": [[[[[[[[[["deep"]]]]]]]]]]}}, "capabilities"),
        ({"capabilities": {"flags": list(range(5000))}}, "capabilities"),
        ({"hugepages_free": {"2048": True}}, "hugepages_free.2048"),
        ({"disk_free_mb": 10**30}, "disk_free_mb"),
    ],
)
def test_host_report_maps_are_bounded(fields: dict[str, Any], location: str) -> None:
    err = _refused(_report(**fields), HostReport)
    assert err.location is not None
    assert err.location.startswith(location)


def test_host_group_metadata_is_bounded() -> None:
    body = json.dumps({"cluster_id": "c1", "host_groups": {"g1": {"cpu_allocation_ratio": "1" * 100_000}}}).encode()
    err = _refused(body, ClusterReport)
    assert err.location == "host_groups.g1.cpu_allocation_ratio"


def test_realistic_capabilities_pass() -> None:
    cpu_info = json.dumps({"vendor": "Intel", "model": "Skylake", "features": [f"f{i}" for i in range(200)]})
    report = decode(_report(capabilities={"cpu_info": cpu_info, "numa": {"cells": [{"id": 0}, {"id": 1}]}}), HostReport)
    assert lookup(report.capabilities, ["cpu_info", "vendor"]) == "Intel"


# ------------------------------------------------------------------------------ unit properties
def test_a_hostile_property_is_refused_at_decode_naming_the_property() -> None:
    filters = [{"unit": "RamFilter", "properties": {"RamAllocationRatio": HOSTILE}}]
    err = _refused(_filter_request(filters=filters))
    assert err.location == "filters.0.properties.RamAllocationRatio"
    weights = {
        "request_id": str(uuid.uuid4()),
        "cluster_id": "c1",
        "state_version": 0,
        "vm": _vm(),
        "hosts": ["h1"],
        "weights": [{"unit": "CPUWeigher", "properties": {"CpuAllocationRatio": HOSTILE}}],
    }
    err = _refused(json.dumps(weights).encode(), WeighRequest)
    assert err.location == "weights.0.properties.CpuAllocationRatio"


def test_policy_properties_are_bounded_where_the_policy_is_made() -> None:
    with pytest.raises(ValidationError) as err:
        Policy(id=uuid.uuid4(), name="p", properties={"RamAllocationRatio": HOSTILE})
    assert err.value.errors()[0]["loc"] == ("properties", "RamAllocationRatio")


_EVERY_PROPERTY = sorted({(u.name, p) for u in REGISTRY.values() for p in u.properties})


@pytest.mark.parametrize(("unit_name", "prop"), _EVERY_PROPERTY)
def test_a_100k_value_of_any_unit_property_is_refused_before_its_regex_runs(
    unit_name: str, prop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate_properties is the last gate before a unit (messages built in-process skip decode):
    the length bound is checked first, so no regex ever sees a long value."""

    def no_regex(self: PropertySpec, value: str) -> bool:
        raise AssertionError(f"the regex ran on a {len(value)}-character value")

    monkeypatch.setattr(PropertySpec, "matches", no_regex)
    with pytest.raises(PropertyTooLong) as err:
        validate_properties(REGISTRY[unit_name], {prop: HOSTILE})
    assert isinstance(err.value, InvalidProperty)
    assert err.value.location == f"properties.{prop}"
    assert f"the limit is {MAX_PROPERTY_VALUE}" in err.value.message
    assert len(err.value.message) < 300  # the value itself is not echoed back


def test_a_value_at_the_limit_still_reaches_its_regex() -> None:
    unit = REGISTRY["MetricsWeigher"]
    setting = ", ".join(f"m{i}=1.0" for i in range(200))[:MAX_PROPERTY_VALUE].rsplit(",", 1)[0]
    assert validate_properties(unit, {"WeightSetting": setting})["WeightSetting"] == setting
    with pytest.raises(InvalidProperty, match="does not match"):
        validate_properties(REGISTRY["RamFilter"], {"RamAllocationRatio": "0." + "1" * 1000 + "x"})


# ----------------------------------------------------------------------------- regex linearity
@pytest.mark.parametrize(
    "regex", sorted({spec.regex for unit in REGISTRY.values() for spec in unit.properties.values()})
)
def test_every_property_regex_is_linear(regex: str) -> None:
    assert ambiguity(regex) is None


@pytest.mark.parametrize(
    "regex",
    [
        r"^((0\.[0-9]*[1-9][0-9]*)|([1-9][0-9]*(\.[0-9]+)?))$",  # the old allocation-ratio regex
        r"^(a+)+$",
        r"^(a*)*b$",
        r"^(a|b*)*$",
        r"^[0-9]*[0-9]+$",
        r"^\s*[^=]*\s*=",
        r"^(ab|[a-z]c)*$",
        r"^x{0,1000}x$",
    ],
)
def test_backtracking_shapes_are_found(regex: str) -> None:
    assert ambiguity(regex) is not None


@pytest.mark.parametrize(
    "regex", [r"^(100|[1-9]|[1-9][0-9])$", r"^1?[0-9]?[0-9]$", r"^(,[a-z]+)*$", r"^[a-z]{2,5}$", r"^(a|ab)*$"]
)
def test_bounded_or_deterministic_shapes_pass(regex: str) -> None:
    assert ambiguity(regex) is None


def test_a_unit_cannot_declare_a_backtracking_regex() -> None:
    with pytest.raises(ValueError, match="backtrack"):
        PropertySpec(r"^([0-9]+)*$", "1")
    with pytest.raises(UnsupportedRegex):
        ambiguity(r"^(a)\1$")


def test_the_allocation_ratio_regex_accepts_exactly_positive_decimals_without_leading_zeros() -> None:
    old = re.compile(r"((0\.[0-9]*[1-9][0-9]*)|([1-9][0-9]*(\.[0-9]+)?))")
    new = RAM_RATIO.regex.removeprefix("^").removesuffix("$")
    for n in range(1, 8):
        for chars in itertools.product("01.5x", repeat=n):
            value = "".join(chars)
            assert (old.fullmatch(value) is None) == (re.fullmatch(new, value) is None), value


# ------------------------------------------------------------------------------ validation cache
def test_the_cache_is_bounded_in_characters_and_entries() -> None:
    cache = ValidationCache(max_entries=100, max_chars=1000, max_entry_chars=300)
    unit = REGISTRY["RamFilter"]
    for i in range(50):
        cache.put((unit, (("P", f"{i:0>200}"),)), (), 201)
    assert cache.chars <= 1000
    assert len(cache) == 4  # 4 x 201 fits in 1000, a fifth does not
    assert cache.get((unit, (("P", f"{49:0>200}"),))) == ()  # the newest stay
    assert cache.get((unit, (("P", f"{0:0>200}"),))) is None
    cache.put((unit, (("P", "x" * 400),)), (), 401)  # larger than one entry may be: not kept
    assert cache.get((unit, (("P", "x" * 400),))) is None
    for i in range(300):
        cache.put((unit, (("P", str(i)),)), (), 1)
    assert len(cache) == 100


def test_distinct_long_property_values_do_not_grow_the_process_cache() -> None:
    """300 distinct 1 MB values once grew a worker by ~310 MB; now they are refused by length, and
    distinct values under the limit are held within the cache's character bound."""
    REGISTRY["MetricsWeigher"].validation.clear()
    unit = REGISTRY["MetricsWeigher"]
    for i in range(3000):
        setting = f"m{i}=1.0, " + ", ".join(f"metric{j}=-1.5" for j in range(60))
        assert len(setting) <= MAX_PROPERTY_VALUE
        validate_properties(unit, {"WeightSetting": setting})
    assert 0 < unit.validation.cache.chars <= unit.validation.cache.max_chars
    assert len(unit.validation.cache) < 3000
    for i in range(300):
        with pytest.raises(PropertyTooLong):
            validate_properties(unit, {"WeightSetting": f"m{i}=1.0" + " " * 1_000_000})
    assert unit.validation.cache.chars <= unit.validation.cache.max_chars


def test_a_cached_result_is_the_validated_one() -> None:
    REGISTRY["RamFilter"].validation.clear()
    unit = REGISTRY["RamFilter"]
    first = validate_properties(unit, {"RamAllocationRatio": "2.5", "Unrelated": "x"})
    again = validate_properties(unit, {"RamAllocationRatio": "2.5"})
    assert first == again == {"RamAllocationRatio": "2.5"}
    with pytest.raises(InvalidProperty):
        validate_properties(unit, {"RamAllocationRatio": "0.0"})


# ------------------------------------------------------------------------- what reaches the units
def test_a_long_host_capability_does_not_break_the_filter_reply() -> None:
    """A reason quoted the host's whole capability value; past FilteredHost.reason's bound the
    filter chain failed for every request, not just for this host."""
    hosts = table(host("h1", capabilities={"cpu_info": {"features": "f" * 8000}}), host("h2"))
    spec = vm(extra_specs={"capabilities:cpu_info:features": "s== avx"})
    out = run_filters(hosts, spec, [UnitCall(unit="ComputeCapabilitiesFilter")])
    assert list(out.survivors.ids) == []
    reason = next(r.reason for r in out.removed if r.host_id == "h1")
    assert reason.endswith("...")
    assert len(reason) < 700


def test_capability_json_nested_past_the_recursion_limit_is_not_a_crash() -> None:
    cpu_info = '{"a": ' + "[" * 4000 + "]" * 4000 + "}"
    assert len(cpu_info) <= 8192
    assert lookup({"cpu_info": cpu_info}, ["cpu_info", "a", "b"]) is None


def test_a_valid_request_decoded_from_json_runs_through_filters_and_weights() -> None:
    filters: list[dict[str, Any]] = [
        {"unit": "RamFilter", "properties": {"RamAllocationRatio": "0.0001"}},
        {"unit": "JsonFilter"},
    ]
    body = _filter_request({"query": [">=", "$free_ram_mb", 0]}, filters)
    req = decode(body, FilterRequest)
    hosts = table(host("h1"), host("h2", mem_free_mb=0))
    out = run_filters(hosts, req.vm, req.filters)
    assert list(out.survivors.ids) == []  # 4096 MB x 0.0001 holds no 1 GB VM
    spec = VmSpec.model_validate_json(json.dumps(_vm()))
    weights = run_weights(hosts, spec, [UnitCall(unit="CPUWeigher", factor=1)])
    assert len(weights) == 1
    assert len(weights[0]) == 2


def test_a_reason_quoting_an_escaped_value_stays_within_its_bound() -> None:
    """repr escapes a non-printable character as up to 10 characters, so even a value within its
    bound can quote to a reason ten times longer; the filter reply must still be valid."""
    arch = "\U000e0001" * MAX_IMAGE_PROPERTY_VALUE
    spec = decode(json.dumps(_vm(image_properties={"hw_architecture": arch})).encode(), VmSpec)
    out = run_filters(table(host("h1")), spec, [UnitCall(unit="ImagePropertiesFilter")])
    assert [r.host_id for r in out.removed] == ["h1"]
    assert len(out.removed[0].reason) == MAX_TEXT
    assert out.removed[0].reason.startswith("architecture 'x86_64', image needs ")


def test_a_stored_record_skips_the_json_walk_that_a_message_from_the_bus_gets() -> None:
    deep = {"a": [[[[[[[[[["deep"]]]]]]]]]]}
    blob = host("h1").model_dump(mode="json")
    blob["report"]["capabilities"] = deep
    raw = json.dumps(blob)
    with pytest.raises(ValidationError, match="nested deeper"):
        HostState.model_validate_json(raw)
    assert parse_stored(HostState, raw).report.capabilities == deep
    # a record too large to be trusted is walked again
    blob["vm_ids"] = [f"vm-{i:07d}" for i in range(MAX_TRUSTED_BYTES // 10)]
    with pytest.raises(ValidationError, match="nested deeper"):
        parse_stored(HostState, json.dumps(blob))
