"""Extra-spec operator grammar, scoped keys and the JsonFilter evaluator (hand-computed cases)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vmsched.errors import InvalidQuery
from vmsched.scheduling.units.extra_specs import (
    MAX_QUERY_DEPTH,
    check_query,
    evaluate_query,
    lookup,
    mapping_resolver,
    match,
    query_passes,
    spec_path,
    spec_string,
)


# ------------------------------------------------------------------------------------- operators
@pytest.mark.parametrize(
    ("value", "requirement", "expected"),
    [
        # the examples in Nova's filter scheduler documentation
        ("5", ">= 5", True),
        ("6", ">= 5", True),
        ("4", ">= 5", False),
        ("2.1.0", "s== 2.1.0", True),
        ("2.1.1", "s== 2.1.0", False),
        ("gcc-12 clang", "<in> gcc", True),
        ("clang", "<in> gcc", False),
        ("['aes', 'mmx', 'sse']", "<all-in> aes mmx", True),
        ("['aes', 'sse']", "<all-in> aes mmx", False),
        ("fpu", "<or> fpu <or> gpu", True),
        ("gpu", "<or> fpu <or> gpu", True),
        ("tpu", "<or> fpu <or> gpu", False),
        # "=" is at-least, not equality
        ("48", "= 24", True),
        ("24", "= 24", True),
        ("12", "= 24", False),
        # numeric ==, !=, <=: numbers, not strings
        ("2000000", "== 2000000", True),
        ("2000000.0", "== 2e6", True),
        ("1", "!= 2", True),
        ("2.0", "!= 2", False),
        ("10", "<= 10", True),
        ("11", "<= 10", False),
        ("9", ">= 10", False),  # as strings "9" >= "10"; as numbers it is not
        # string comparisons
        ("abc", "s!= abd", True),
        ("abc", "s< abd", True),
        ("abd", "s< abd", False),
        ("abd", "s<= abd", True),
        ("b", "s> abc", True),
        ("abc", "s>= abc", True),
        ("10", "s< 9", True),  # string order
        # > and < are not operators: the requirement is a literal string
        ("3", "> 2", False),
        ("> 2", "> 2", True),
        ("1", "< 2", False),
        ("< 2", "< 2", True),
        # no operator: plain string equality of the whole requirement
        ("QEMU", "QEMU", True),
        ("qemu", "QEMU", False),
        ("Intel Xeon", "Intel Xeon", True),
        ("", "", True),
        # multi-word operands (vmsched: the rest of the requirement)
        ("Intel Xeon", "s== Intel Xeon", True),
        ("Intel", "s== Intel Xeon", False),
        ("Intel Xeon Gold", "<in> Xeon Gold", True),
        ("Intel Xeon", "<or> AMD EPYC <or> Intel Xeon", True),
        ("Intel", "<or> AMD EPYC <or> Intel Xeon", False),
    ],
)
def test_operators(value: str, requirement: str, expected: bool) -> None:
    assert match(value, requirement) is expected


@pytest.mark.parametrize(
    "requirement", ["=", "==", "!=", ">=", "<=", "s==", "s!=", "s<", "s<=", "s>", "s>=", "<in>", "<all-in>", "<or>"]
)
def test_operator_without_operand_never_matches(requirement: str) -> None:
    assert not match("anything", requirement)
    assert not match(requirement, requirement)
    assert not match("", requirement)
    assert not match("x", requirement + "   ")


@pytest.mark.parametrize("requirement", [">= 5", "s== a", "<in> a", "<all-in> a", "<or> a", "a", "> 2", ""])
def test_missing_value_never_matches(requirement: str) -> None:
    assert not match(None, requirement)


@pytest.mark.parametrize(("value", "requirement"), [("abc", ">= 5"), ("5", ">= five"), ("", "= 1"), ("1,5", "== 1")])
def test_non_numbers_never_match_numeric_operators(value: str, requirement: str) -> None:
    assert not match(value, requirement)


def test_or_needs_a_real_alternative() -> None:
    assert not match("a", "<or> <or>")
    assert match("a", "<or> <or> a")
    assert not match("", "<or> a <or>")


@pytest.mark.parametrize(
    ("value", "requirement", "expected"),
    [
        # Nova accepts a closing <in> and matches it like the bare form
        ("12311321", "<in> 12311321 <in>", True),
        ("12311321", "<in> 11 <in>", True),
        ("12310321", "<in> 11 <in>", False),
        ("Intel Xeon Gold", "<in> Xeon Gold <in>", True),
        ("Intel Xeon", "<in> Xeon Gold <in>", False),
        # the operand ends at the keyword (Nova reads only the first operand word)
        ("gcc-12", "<in> gcc <in> rust", True),
        ("rust", "<in> gcc <in> rust", False),
        # nothing before the keyword: no operand
        ("<in>", "<in> <in>", False),
        ("x", "<in> <in> x", False),
    ],
)
def test_in_with_closing_keyword(value: str, requirement: str, expected: bool) -> None:
    assert match(value, requirement) is expected


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_numeric_operators_agree_with_python(x: int, y: int) -> None:
    v = str(x)
    assert match(v, f"= {y}") is (x >= y)
    assert match(v, f">= {y}") is (x >= y)
    assert match(v, f"<= {y}") is (x <= y)
    assert match(v, f"== {y}") is (x == y)
    assert match(v, f"!= {y}") is (x != y)


@given(st.text(alphabet="abcxyz", min_size=1, max_size=6), st.text(alphabet="abcxyz", min_size=1, max_size=6))
def test_string_operators_agree_with_python(a: str, b: str) -> None:
    assert match(a, f"s== {b}") is (a == b)
    assert match(a, f"s!= {b}") is (a != b)
    assert match(a, f"s< {b}") is (a < b)
    assert match(a, f"s>= {b}") is (a >= b)
    assert match(a, f"<in> {b}") is (b in a)
    assert match(a, b) is (a == b)


# ---------------------------------------------------------------------------------- host values
@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, None),
        (4096.0, "4096"),
        (1.5, "1.5"),
        (float("nan"), None),
        (True, "True"),
        (7, "7"),
        ("QEMU", "QEMU"),
        (["aes", "mmx"], "['aes', 'mmx']"),
        (("aes",), "['aes']"),
        (frozenset({"b", "a"}), "['a', 'b']"),
        ({"k": 1}, "{'k': 1}"),
    ],
)
def test_spec_string(value: Any, text: str | None) -> None:
    assert spec_string(value) == text


# ----------------------------------------------------------------------------------- scoped keys
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("capabilities:cpu_info:features", (True, ["cpu_info", "features"])),
        ("capabilities:hypervisor_type", (True, ["hypervisor_type"])),
        ("free_ram_mb", (False, ["free_ram_mb"])),
        ("hw:cpu_policy", None),
        ("quota:disk_read_bytes_sec", None),
        ("capabilities:", None),
        ("capabilities::x", None),
    ],
)
def test_spec_path(key: str, expected: tuple[bool, list[str]] | None) -> None:
    assert spec_path(key) == expected


def test_spec_path_other_scope() -> None:
    assert spec_path("aggregate_instance_extra_specs:ssd", "aggregate_instance_extra_specs") == (True, ["ssd"])
    assert spec_path("capabilities:ssd", "aggregate_instance_extra_specs") is None


def test_lookup_nested_and_json() -> None:
    caps = {"cpu_info": {"features": ["aes"], "vendor": "Intel"}, "json": '{"a": {"b": 3}}', "n": 0}
    assert lookup(caps, ["cpu_info", "features"]) == ["aes"]
    assert lookup(caps, ["cpu_info", "vendor"]) == "Intel"
    assert lookup(caps, ["json", "a", "b"]) == 3
    assert lookup(caps, ["n"]) == 0  # falsy values are values
    assert lookup(caps, ["cpu_info", "missing"]) is None
    assert lookup(caps, ["cpu_info", "vendor", "deeper"]) is None  # a non-JSON string
    assert lookup(caps, ["n", "deeper"]) is None
    assert lookup(caps, []) is caps


# -------------------------------------------------------------------------------------- JsonFilter
HOST = {
    "free_ram_mb": 2048.0,
    "free_disk_mb": 300 * 1024.0,
    "hypervisor_type": "QEMU",
    "enabled": True,
    "capabilities": {"cpu_info": {"vendor": "Intel"}},
    "x": 1,
}


def q(query: list[Any] | None, attrs: dict[str, Any] = HOST) -> bool:
    return query_passes(query, mapping_resolver(attrs))


def test_a_memory_and_disk_query_passes_only_a_host_with_enough_of_both() -> None:
    query = ["and", [">=", "$free_ram_mb", 1024], [">=", "$free_disk_mb", 200 * 1024]]
    assert q(query)
    assert not q(query, {**HOST, "free_disk_mb": 100 * 1024.0})


def test_empty_query_passes() -> None:
    assert q(None)
    assert q([])


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (["=", "$x", 1], True),
        (["=", "$x", 1, 1.0], True),
        (["=", "$x", 1, 2], False),  # the first compared with every other
        (["<", "$x", 2, 3], True),
        (["<", "$x", 2, 1], False),
        ([">", "$free_ram_mb", 1024, 2047], True),
        ([">", "$free_ram_mb", 2048], False),
        ([">=", "$free_ram_mb", 2048], True),
        (["<=", "$free_ram_mb", 2048, 4096], True),
        (["=", "$x"], False),  # fewer than two arguments
        (["=", "$missing", 1], False),  # the reference is dropped: one argument left
        (["in", "$hypervisor_type", "KVM", "QEMU"], True),
        (["in", "$hypervisor_type", "KVM"], False),
        (["in", "$hypervisor_type"], False),
        (["=", "$capabilities.cpu_info.vendor", "Intel"], True),
        (["=", "$capabilities.cpu_info.missing", "Intel"], False),
        (["and", "$enabled", ["=", "$x", 1]], True),
        (["or", ["=", "$x", 2], ["=", "$x", 1]], True),
        (["or", ["=", "$x", 2], ["=", "$x", 3]], False),
        (["and"], True),
        (["or"], False),
        (["<", "$hypervisor_type", 3], False),  # incomparable types: False, not an exception
        (["=", "", ""], False),  # empty strings are dropped, as in Nova
    ],
)
def test_query_operators(query: list[Any], expected: bool) -> None:
    assert q(query) is expected


def test_not_is_real_negation_when_nested() -> None:
    """Nova's `not` returns a list: ['and', ['not', X], ...] then ignores the `not`. vmsched negates."""
    query = ["and", ["not", ["=", "$x", 1]], [">=", "$free_ram_mb", 1024]]
    assert not q(query)  # x == 1, so not(x == 1) is False: the host fails
    assert q(query, {**HOST, "x": 2})
    assert q(["or", ["not", ["=", "$x", 1]], ["not", ["=", "$x", 2]]])
    assert not q(["and", ["not", ["=", "$x", 1]]])


def test_not_at_top_level_matches_nova() -> None:
    # Nova: any([not a, not b]) == not (a and b)
    assert not q(["not", ["=", "$x", 1]])
    assert q(["not", ["=", "$x", 2]])
    assert q(["not", ["=", "$x", 1], ["=", "$x", 2]])
    assert not q(["not", ["=", "$x", 1], [">", "$free_ram_mb", 0]])
    assert not q(["not", "$missing"])  # nothing left to negate: False, as Nova's any([])
    assert not q(["not", "$enabled"])


@pytest.mark.parametrize("query", [["nope", 1], [1, 2], ["and", ["=", 1, 1], ["xor", 1]]])
def test_malformed_queries_raise(query: list[Any]) -> None:
    with pytest.raises(InvalidQuery):
        check_query(query)
    with pytest.raises(InvalidQuery):
        q(query)


def test_deep_queries_are_refused() -> None:
    deep: list[Any] = ["=", 1, 1]
    for _ in range(MAX_QUERY_DEPTH + 1):
        deep = ["not", deep]
    with pytest.raises(InvalidQuery, match="deeper"):
        check_query(deep)


_leaf = st.builds(
    lambda op, ref, n: [op, ref, n],
    st.sampled_from(["=", "<", ">", "<=", ">="]),
    st.sampled_from(["$x", "$free_ram_mb", "$missing"]),
    st.integers(-2, 3000),
)
_queries = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(lambda a: ["not", a], inner),
        st.builds(lambda a, b: ["and", a, b], inner, inner),
        st.builds(lambda a, b: ["or", a, b], inner, inner),
    ),
    max_leaves=8,
)
_hosts = st.fixed_dictionaries({"x": st.integers(-2, 3), "free_ram_mb": st.integers(0, 3000)})


@given(_queries, _hosts)
def test_double_negation_is_identity(query: list[Any], attrs: dict[str, Any]) -> None:
    resolve = mapping_resolver(attrs)
    assert evaluate_query(["not", ["not", query]], resolve) == evaluate_query(query, resolve)


@given(_queries, _queries, _hosts)
def test_de_morgan(a: list[Any], b: list[Any], attrs: dict[str, Any]) -> None:
    resolve = mapping_resolver(attrs)
    assert evaluate_query(["not", ["and", a, b]], resolve) == evaluate_query(["or", ["not", a], ["not", b]], resolve)
    assert evaluate_query(["and", ["not", a], b], resolve) == (
        (not evaluate_query(a, resolve)) and evaluate_query(b, resolve)
    )
