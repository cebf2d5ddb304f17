"""Policies as documents (scheduling/policy_docs.py) and as files (`vmsched policy` YAML, nova.conf):
conversion both ways, validation in words, diffs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.contracts import ClusterAttachment, FilterEntry, FilterPosition, PolicyDocument, PolicySet, WeightEntry
from vmsched.errors import InvalidRequest, UsageError
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.scheduling.policy_docs import attachment_diff, diff, document_of, expected, policy_of, problems
from vmsched.scheduling.units import REGISTRY
from vmsched_services.tools.nova_import import import_nova
from vmsched_services.tools.policy_commands import dump_set, read_set


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_a_builtin_survives_document_and_back_and_validates(name: str) -> None:
    policy = BUILTIN_POLICIES[name]
    doc = document_of(policy)
    back = policy_of(doc, policy.id)
    assert back.model_dump(exclude={"locked", "is_default"}) == policy.model_dump(exclude={"locked", "is_default"})
    assert problems(doc, REGISTRY) == []


@pytest.mark.parametrize(
    ("regex", "words"),
    [
        (r"^([5-9][0-9])$", "a whole number from 50 to 99"),
        (r"^([1-9][0-9]*)$", "a whole number of at least 1"),
        (r"^(true|false)$", "true or false"),
        (r"^(first|none|last)$", "one of first, none, last"),
        (r"^([0-9]+(\.[0-9]+)?)$", None),  # decimals: no words, the regex is shown instead
    ],
)
def test_a_property_regex_in_words_says_what_it_accepts(regex: str, words: str | None) -> None:
    assert expected(regex) == words


def _described(words: str) -> set[str]:
    """The values a sentence of `expected` admits, among 0..200 (and the words it lists)."""
    if words.startswith("one of ") or " or " in words:
        return set(re.split(r", | or ", words.removeprefix("one of ")))
    numbers = [int(x) for x in re.findall(r"\d+", words)]
    high = numbers[1] if "from" in words else 200
    return {str(n) for n in range(numbers[0], high + 1)}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 120), st.integers(0, 120), st.booleans())
def test_the_words_admit_exactly_what_the_regex_does(low: int, high: int, as_range: bool) -> None:
    low, high = min(low, high), max(low, high)
    if as_range and low < 10 <= high < 100:
        regex = f"^([{low}-9]|[1-{high // 10 - 1}][0-9]|{high // 10}[0-{high % 10}])$" if high >= 20 else None
    else:
        regex = "^(" + "|".join(str(n) for n in range(low, high + 1)) + ")$"
    if regex is None:
        return
    words = expected(regex)
    assert words is not None
    admitted = _described(words)
    pattern = re.compile(regex[1:-1])
    assert {str(n) for n in range(201) if pattern.fullmatch(str(n))} == {w for w in admitted if w.isdigit()}


def test_every_problem_is_found_at_once_with_a_fix() -> None:
    doc = PolicyDocument(
        name="bad",
        filters=[FilterEntry(unit="Memroy"), FilterEntry(unit="CPU"), FilterEntry(unit="CPU")],
        weights=[WeightEntry(unit="Memory")],
        selector="RankSelecter",
        properties={"HighUtilization": "120", "HighUtilisation": "80"},
    )
    found = problems(doc.model_copy(update={"filters": [*doc.filters, FilterEntry(unit="CPUOverloaded")]}), REGISTRY)
    assert "filter units listed twice: CPU" in found
    assert "unknown filter unit 'Memroy'; did you mean 'Memory'?" in found
    assert "Memory is not a weight unit (it is a filter unit)" in found
    assert "unknown selector 'RankSelecter'; did you mean 'RankSelector'?" in found
    assert any(
        p.startswith("HighUtilization must be a whole number from 50 to 99 (default 80), not '120'") for p in found
    )
    assert "property 'HighUtilisation' is not read by any unit of the policy; did you mean 'HighUtilization'?" in found


def test_a_unit_a_running_service_lacks_is_a_problem() -> None:
    doc = document_of(BUILTIN_POLICIES["none"])
    everything = frozenset(REGISTRY)
    assert problems(doc, REGISTRY, available={"filter-worker": everything, "weigher": everything}) == []
    found = problems(doc, REGISTRY, available={"filter-worker": everything - {"Swap"}})
    assert found == ["filter unit Swap is not available in the running filter-worker (is its plugin installed?)"]


def test_diffs_say_what_changed_line_by_line() -> None:
    old = document_of(BUILTIN_POLICIES["none"])
    new = old.model_copy(
        update={
            "description": "mine",
            "filters": [FilterEntry(unit="Memory", position=FilterPosition.FIRST)]
            + [f for f in old.filters if f.unit not in ("Memory", "Swap")],
            "weights": [WeightEntry(unit="PreferredHosts", factor=500)],
            "properties": {"HighUtilization": "75"},
        }
    )
    lines = diff(old, new)
    assert f"~ description: {old.description!r} -> 'mine'" in lines
    assert "- filter Swap" in lines
    assert any(line.startswith("~ filter order: Memory (first), Migration (first)") for line in lines)
    assert "- weight OptimalForEvenCpuDistribution" in lines
    assert "~ weight PreferredHosts factor 99 -> 500" in lines
    assert "+ property HighUtilization = '75'" in lines
    assert diff(new, new) == []
    assert diff(None, new)[0] == "+ description: 'mine'"
    a = ClusterAttachment(cluster_id="c1", policy="p")
    assert attachment_diff(None, a) == ["+ policy p"]
    b = a.model_copy(update={"policy": "q", "ha_reservation": True, "properties": {"X": "1"}})
    assert attachment_diff(a, b) == ["~ policy p -> q", "~ ha_reservation False -> True", "+ property X = '1'"]


def test_a_policy_file_round_trips_with_filters_as_plain_names(tmp_path: Path) -> None:
    doc = document_of(BUILTIN_POLICIES["evenly_distributed"])
    original = PolicySet(policies=[doc], clusters=[ClusterAttachment(cluster_id="c1", policy=doc.name)])
    text = dump_set(original)
    assert "schema_version" not in text
    assert "- Memory\n" in text  # a filter in list order is written as its name
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert read_set(str(path)) == original


def test_a_broken_file_says_where(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("policies:\n  - name: x\n    weights: [{unit: RAMWeigher, factor: lots}]\n")
    with pytest.raises(InvalidRequest, match=r"policies\.0\.weights\.0\.factor"):
        read_set(str(path))
    path.write_text("- just\n- a list\n")
    with pytest.raises(InvalidRequest, match="expected a mapping"):
        read_set(str(path))
    with pytest.raises(UsageError, match=r"missing\.yaml: cannot read it"):  # the command's error: exit 2, said as is
        read_set(str(tmp_path / "missing.yaml"))


def test_nova_conf_becomes_a_policy_with_its_filters_and_multipliers(tmp_path: Path) -> None:
    conf = tmp_path / "nova.conf"
    conf.write_text(
        "[DEFAULT]\ndebug = true\n\n[filter_scheduler]\n"
        "enabled_filters = ComputeFilter, RamFilter,\n    AvailabilityZoneFilter\n"
        "weight_classes = nova.scheduler.weights.ram.RAMWeigher,nova.scheduler.weights.cpu.CPUWeigher\n"
        "ram_weight_multiplier = -1.0\ncpu_weight_multiplier = 0.0\n"
    )
    imported = import_nova(str(conf), "from-nova", REGISTRY)
    doc = imported.document
    assert [f.unit for f in doc.filters] == ["ComputeFilter", "RamFilter", "AvailabilityZoneFilter"]
    assert [(w.unit, w.factor) for w in doc.weights] == [("RAMWeigher", -1)]  # a zero multiplier drops the weigher
    assert imported.problems == imported.warnings == []
    assert problems(doc, REGISTRY) == []
    conf.write_text("[filter_scheduler\nenabled_filters = RamFilter\n")
    with pytest.raises(InvalidRequest, match=r"cannot read it as nova\.conf"):
        import_nova(str(conf), "x", REGISTRY)


def test_budget_properties_belong_to_a_policy_that_balances_and_are_checked_like_a_units() -> None:
    balancing = PolicyDocument(
        name="p", filters=[FilterEntry(unit="Memory")], balance="EvenCpuSpread",
        properties={"MigrationsPerHostPerHour": "3", "ConcurrentMigrations": "lots"},
    )  # fmt: skip
    found = problems(balancing, REGISTRY)
    assert found == [
        "ConcurrentMigrations must be a whole number of at least 0 (default 2), not 'lots': "
        "disruption budgets reads it (balancing migrations in flight at once)"
    ]
    still = PolicyDocument(name="q", filters=[FilterEntry(unit="Memory")], properties={"ConcurrentMigrations": "2"})
    assert problems(still, REGISTRY) == ["property 'ConcurrentMigrations' is not read by any unit of the policy"]
