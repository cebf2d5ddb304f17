"""Weight factors are decimals end to end: the contracts take 1.5 and refuse what is not a finite
factor within the bound (naming the unit and the value), policy files carry 1.5 through export and
apply with no difference while whole factors stay written as integers, the built-ins keep their
integer factors, and the selectors weigh with decimal factors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.factories import floats, schedule_decision
from vmsched.contracts import Explanation, PolicyDocument, PolicySet, UnitCall, WeightEntry
from vmsched.contracts.base import MAX_FACTOR
from vmsched.errors import InvalidRequest
from vmsched.explain import render_table
from vmsched.scheduling.policy import BUILTIN_POLICIES, PolicyWeight
from vmsched.scheduling.policy_docs import diff, document_of, policy_of
from vmsched.scheduling.selection import SELECTORS, WeighedUnit, min_max_select, rank_select
from vmsched.scheduling.units.base import Direction
from vmsched_services.tools.policy_commands import dump_set, read_set

LOWER, HIGHER = Direction.LOWER_IS_BETTER, Direction.HIGHER_IS_BETTER


# ------------------------------------------------------------------------------------ contracts
@pytest.mark.parametrize("value", [1.5, 0.1, -2.5, 0.25, 1e-6, 999_999.5, 1e6, -1e6, MAX_FACTOR])
def test_a_decimal_factor_is_accepted_as_it_is(value: float) -> None:
    for model in (WeightEntry, PolicyWeight, UnitCall):
        assert model(unit="RAMWeigher", factor=value).factor == value


def test_a_whole_factor_is_held_and_written_as_an_integer() -> None:
    for value in (2, 2.0, 1e6, -0.0):
        entry = WeightEntry(unit="RAMWeigher", factor=value)
        assert type(entry.factor) is int
        assert entry.model_dump()["factor"] == int(value)
        assert json.loads(entry.model_dump_json())["factor"] == int(value)
        assert '"factor":' + str(int(value)) in entry.model_dump_json()
    assert type(WeightEntry(unit="RAMWeigher", factor=1.5).factor) is float
    assert type(WeightEntry(unit="RAMWeigher").factor) is int  # the default, 1


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (math.nan, "weight RAMWeigher: factor nan is not a finite number"),
        (math.inf, "weight RAMWeigher: factor inf is not a finite number"),
        (-math.inf, "weight RAMWeigher: factor -inf is not a finite number"),
        (1_000_000.5, "weight RAMWeigher: factor 1000000.5 is out of range: a factor is from -1000000 to 1000000"),
        (-2_000_000, "weight RAMWeigher: factor -2000000 is out of range: a factor is from -1000000 to 1000000"),
        (10**400, "weight RAMWeigher: factor a number of 401 digits is out of range"),
        ("1e6", "weight RAMWeigher: factor '1e6' is text, not a number: write it unquoted"),
    ],
)
def test_what_is_not_a_factor_is_refused_naming_the_unit_and_the_value(value: object, says: str) -> None:
    for model in (WeightEntry, PolicyWeight, UnitCall):
        with pytest.raises(ValidationError) as info:
            model(unit="RAMWeigher", factor=value)
        assert says in str(info.value)


def test_a_policy_file_with_a_bad_factor_says_where_which_unit_and_what(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "policies:\n  - name: x\n    weights: [{unit: CPUWeigher, factor: 1}, {unit: RAMWeigher, factor: .inf}]\n"
    )
    with pytest.raises(
        InvalidRequest, match=r"policies\.0\.weights\.1\.factor: .*weight RAMWeigher: factor inf is not"
    ):
        read_set(str(path))
    as_json = tmp_path / "p.json"  # Python's JSON reads NaN as a number, YAML as text: both refused
    as_json.write_text('{"policies": [{"name": "x", "weights": [{"unit": "RAMWeigher", "factor": NaN}]}]}')
    with pytest.raises(InvalidRequest, match="weight RAMWeigher: factor nan is not a finite number"):
        read_set(str(as_json))
    path.write_text("policies:\n  - name: x\n    weights: [{unit: RAMWeigher, factor: NaN}]\n")
    with pytest.raises(InvalidRequest, match="weight RAMWeigher: factor 'NaN' is not a finite number"):
        read_set(str(path))
    path.write_text("policies:\n  - name: x\n    weights: [{unit: RAMWeigher, factor: 1e7}]\n")  # YAML 1.1: text
    with pytest.raises(InvalidRequest, match=r"factor '1e7' is text, not a number: .*\(1\.0e\+6, not 1e6\)"):
        read_set(str(path))
    path.write_text("policies:\n  - name: x\n    weights: [{unit: RAMWeigher, factor: 1.0e+7}]\n")
    with pytest.raises(
        InvalidRequest, match=r"factor 10000000\.0 is out of range: a factor is from -1000000 to 1000000"
    ):
        read_set(str(path))


# ------------------------------------------------------------------------------------ files
def _doc() -> PolicyDocument:
    return PolicyDocument(
        name="decimal",
        weights=[
            WeightEntry(unit="RAMWeigher", factor=1.5),
            WeightEntry(unit="CPUWeigher", factor=0.1),
            WeightEntry(unit="DiskWeigher", factor=2),
            WeightEntry(unit="BuildFailureWeigher", factor=1_000_000.0),
            WeightEntry(unit="IoOpsWeigher", factor=-0.25),
        ],
        selector="MinMaxSelector",
    )


def test_decimal_factors_survive_export_and_apply_with_no_difference(tmp_path: Path) -> None:
    doc = _doc()
    text = dump_set(PolicySet(policies=[doc]))
    for written in ("factor: 1.5\n", "factor: 0.1\n", "factor: 2\n", "factor: 1000000\n", "factor: -0.25\n"):
        assert written in text
    assert ".0\n" not in text  # no whole factor written as 2.0
    path = tmp_path / "p.yaml"
    path.write_text(text)
    back = read_set(str(path)).policies[0]
    assert back == doc
    assert diff(doc, back) == []
    # As policy-admin stores a version (jsonb) and reads it back, and through the Policy the rows hold.
    assert PolicyDocument.model_validate(json.loads(json.dumps(doc.model_dump(mode="json")))) == doc
    policy = policy_of(doc, BUILTIN_POLICIES["none"].id)
    assert document_of(policy) == doc
    assert dump_set(PolicySet(policies=[document_of(policy)])) == text


def test_an_existing_integer_file_exports_unchanged(tmp_path: Path) -> None:
    text = (
        "policies:\n- name: mine\n  description: ''\n  filters: []\n  weights:\n"
        "  - unit: OptimalForEvenCpuDistribution\n    factor: 2\n  - unit: PreferredHosts\n    factor: 99\n"
        "  selector: RankSelector\n  properties: {}\nclusters: []\n"
    )
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert dump_set(read_set(str(path))) == text


def test_the_diff_shows_a_decimal_factor_as_written() -> None:
    old = PolicyDocument(name="x", weights=[WeightEntry(unit="RAMWeigher", factor=1)])
    new = PolicyDocument(name="x", weights=[WeightEntry(unit="RAMWeigher", factor=1.5)])
    assert diff(old, new) == ["~ weight RAMWeigher factor 1 -> 1.5"]
    assert diff(None, new) == ["+ weight RAMWeigher factor 1.5"]
    assert diff(new, PolicyDocument(name="x", weights=[WeightEntry(unit="RAMWeigher", factor=1.50)])) == []


def test_the_builtins_keep_their_integer_factors() -> None:
    expected = {
        "none": {"OptimalForEvenCpuDistribution": 2, "OptimalForEvenMemoryDistribution": 1},
        "power_saving": {"OptimalForCpuPowerSaving": 2, "OptimalForMemoryPowerSaving": 1},
        "vm_evenly_distributed": {"OptimalForEvenGuestDistribution": 2},
    }
    common = {"PreferredHosts": 99, "OptimalForHaReservation": 1, "VmAffinityGroups": 1, "VmToHostsAffinityGroups": 20}
    for name, policy in BUILTIN_POLICIES.items():
        factors = {w.unit: w.factor for w in policy.weights}
        assert all(type(f) is int for f in factors.values()), name
        for unit, factor in {**expected.get(name, {}), **common}.items():
            if unit in factors:
                assert factors[unit] == factor, (name, unit)
        assert "factor: 99\n" in dump_set(PolicySet(policies=[document_of(policy)]))


# ------------------------------------------------------------------------------------ scoring
def test_decimal_factors_weigh_as_written() -> None:
    # Rank points: cpu [0, 1, 2] (C best), memory [2, 1, 0] (A best).
    units = [
        WeighedUnit("cpu", 1.5, np.array([90.0, 50.0, 10.0])),
        WeighedUnit("memory", 2.5, np.array([1024.0, 2048.0, 4096.0])),
    ]
    sel = rank_select(["A", "B", "C"], units)
    assert floats(sel.totals) == [5.0, 4.0, 3.0]  # 2.5 x 2; 1.5 + 2.5; 1.5 x 2
    assert sel.ordered_ids == ["A", "B", "C"]
    assert sel.factors == (1.5, 2.5)
    assert sel.to_score_table().units[0].factor == 1.5
    # Nova's weighing: 1.5 x RAM points against 0.1 x CPU points.
    sel = min_max_select(
        ["h1", "h2"],
        [
            WeighedUnit("ram", 1.5, np.array([1.0, 2.0]), HIGHER),
            WeighedUnit("cpu", 0.1, np.array([8.0, 0.0]), HIGHER),
        ],
    )
    assert floats(sel.totals) == [0.1, 1.5]
    assert sel.best == "h2"


def test_the_score_table_prints_a_decimal_factor() -> None:
    sel = rank_select(["A", "B"], [WeighedUnit("OptimalForEvenCpuDistribution", 1.5, np.array([1.0, 2.0]))])
    scores = sel.to_score_table()
    decision = schedule_decision("c1", host_id="A", explanation=Explanation(summary="2/2", candidates=2, scores=scores))
    row = next(line for line in render_table(decision).splitlines() if "OptimalForEvenCpuDistribution" in line)
    assert row.split()[1:] == ["1.5", "1", "/", "1", "2", "/", "0"]


def test_a_policy_passes_its_decimal_factors_to_the_weighers() -> None:
    policy = policy_of(_doc(), BUILTIN_POLICIES["none"].id)
    assert [c.factor for c in policy.weight_calls()] == [1.5, 0.1, 2, 1_000_000, -0.25]


@st.composite
def _weighing(draw: st.DrawFn) -> tuple[list[str], list[WeighedUnit]]:
    n = draw(st.integers(1, 8))
    units = []
    for j in range(draw(st.integers(1, 4))):
        raw = np.array(draw(st.lists(st.integers(-50, 50), min_size=n, max_size=n)), dtype=np.float64)
        # Quarters: 1.5, 0.25, -2.75 ... (decimals a double holds exactly).
        factor = draw(st.integers(-16, 16)) / 4
        units.append(WeighedUnit(f"u{j}", factor, raw, draw(st.sampled_from([LOWER, HIGHER])), maximum=50.0))
    return [f"h{i}" for i in range(n)], units


@settings(max_examples=200, deadline=None)
@given(_weighing(), st.sampled_from(sorted(SELECTORS)), st.integers(-3, 10))
def test_scaling_every_factor_alike_keeps_the_ranking(
    case: tuple[list[str], list[WeighedUnit]], selector: str, exponent: int
) -> None:
    # Every selector sums factor x points, so a positive scale multiplies every total alike. With a
    # power of two the products are exact, so the order (ties by id included) is exactly the same;
    # another scale can move totals that tie exactly by a rounding error, within TOTAL_DECIMALS.
    ids, units = case
    scale = 2.0**exponent
    scaled = [WeighedUnit(u.unit, u.factor * scale, u.raw, u.direction, u.maximum) for u in units]
    a, b = SELECTORS[selector](ids, units), SELECTORS[selector](ids, scaled)
    assert a.ordered_ids == b.ordered_ids
    assert floats(b.totals) == floats(a.totals * scale)
