"""Weight units for memory power saving, HA reservation and preferred hosts:
OptimalForMemoryPowerSaving, OptimalForHaReservation, PreferredHosts (hand-computed raw weights,
edge cases and invariants)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.factories import floats as w
from tests.factories import host, hosts_n, pend, table, vm
from vmsched.errors import InvalidProperty
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.units.base import Direction, PolicyUnit, validate_properties
from vmsched.scheduling.units.registry import REGISTRY
from vmsched.scheduling.units.weights import (
    EVEN_MEMORY,
    HA_RESERVATION,
    NOT_PREFERRED_WEIGHT,
    POWER_SAVING_MEMORY,
    PREFERRED_HOSTS,
    WEIGHT_UNITS,
    even_memory_weight,
    ha_reservation_weight,
    power_saving_memory_weight,
    preferred_hosts_weight,
)

POWER_HA_PREFERENCE_WEIGHTS = (POWER_SAVING_MEMORY, HA_RESERVATION, PREFERRED_HOSTS)


#: The cluster's HA reservation switch, as vmsched passes it to the units (from PostgreSQL).
ON = {"HaReservation": "true"}


def ha_cluster(hosts: HostTable) -> HostTable:
    """A cluster with HA reservation on: the switch is a property (ON), the table is unchanged."""
    return hosts


# ------------------------------------------------------------------------------------ the units
def test_power_ha_and_preference_weights_are_declared_and_registered() -> None:
    assert [u.name for u in POWER_HA_PREFERENCE_WEIGHTS] == [
        "OptimalForMemoryPowerSaving",
        "OptimalForHaReservation",
        "PreferredHosts",
    ]
    for unit in POWER_HA_PREFERENCE_WEIGHTS:
        assert unit in WEIGHT_UNITS
        assert REGISTRY[unit.name] is unit
        # OptimalForHaReservation also balances (oVirt's HA reservation balance unit)
        assert unit.kinds == (("weight", "balance") if unit is HA_RESERVATION else ("weight",))
        assert unit.direction is Direction.LOWER_IS_BETTER
        assert unit.description
        assert unit.summary


def test_property_defaults_and_regexes() -> None:
    assert validate_properties(HA_RESERVATION, {}) == {
        "ScaleDown": "1",
        "OverUtilization": "200",
        "HaReservation": "false",
    }
    assert validate_properties(POWER_SAVING_MEMORY, {}) == {}
    assert validate_properties(PREFERRED_HOSTS, {}) == {}
    for value in ("1", "9", "10", "99", "100"):
        validate_properties(HA_RESERVATION, {"ScaleDown": value})
    for value in ("0", "101", "010", "x"):
        with pytest.raises(InvalidProperty):
            validate_properties(HA_RESERVATION, {"ScaleDown": value})
    validate_properties(POWER_SAVING_MEMORY, {"MaxFreeMemoryForOverUtilized": "1024"})
    with pytest.raises(InvalidProperty):
        validate_properties(POWER_SAVING_MEMORY, {"MinFreeMemoryForUnderUtilized": "0"})


@pytest.mark.parametrize("unit", POWER_HA_PREFERENCE_WEIGHTS, ids=lambda u: u.name)
def test_zero_one_and_equal_hosts(unit: PolicyUnit) -> None:
    assert unit.weight is not None
    props = validate_properties(unit, {})
    spec = vm(ha=True, preferred_hosts=["h0"])
    assert unit.weight(ha_cluster(table()), spec, props).shape == (0,)
    one = unit.weight(ha_cluster(hosts_n(1, ha_vm_count=2)), spec, props)
    assert one.shape == (1,)
    assert np.isfinite(one).all()
    equal = unit.weight(ha_cluster(hosts_n(4, ha_vm_count=2, mem_committed_mb=1000)), vm(ha=True), props)
    assert len(set(equal.tolist())) == 1


# ------------------------------------------------------------------------------------ OptimalForMemoryPowerSaving
def test_power_saving_memory_hand_computed() -> None:
    # max scheduling memory = 4096 - committed; the VM needs 1024 + 64 = 1088; max_mem = 1.1 x 4096 = 4505.6
    hosts = table(
        host("roomy", mem_committed_mb=0),  # 3008 free after: int(3008 / 4505.6 x 999) + 1 = 667
        host("fullish", mem_committed_mb=2048),  # 960: int(960 / 4505.6 x 999) + 1 = 213
        host("too-full", mem_committed_mb=3500),  # -492 < 0: wrapped to max_mem: 1000
    )
    raw = power_saving_memory_weight(hosts, vm(), {})
    assert w(raw) == [667.0, 213.0, 1000.0]
    assert w(raw) == [math.trunc(m / 4505.6 * 999) + 1 for m in (3008, 960, 4505.6)]


def test_power_saving_memory_limits_wrap_over_utilized_hosts() -> None:
    hosts = table(host("roomy", mem_committed_mb=0), host("fullish", mem_committed_mb=2048))
    props = {"MaxFreeMemoryForOverUtilized": "1000", "MinFreeMemoryForUnderUtilized": "2000"}
    # fullish: 960 < 1000 -> 2000 + 40 = 2040: int(2040 / 4505.6 x 999) + 1 = 453
    assert w(power_saving_memory_weight(hosts, vm(), props)) == [667.0, 453.0]
    # without a high limit the shortfall wraps to the maximum
    assert w(power_saving_memory_weight(hosts, vm(), {"MaxFreeMemoryForOverUtilized": "1000"})) == [667.0, 1000.0]


def test_power_saving_memory_pending_current_host_and_no_memory() -> None:
    hosts = table(host("h1"), host("h2"), pending=[pend("h2", mem_mb=2048)])
    # h2: 4096 - 2048 pending - 1088 = 960 -> 213
    assert w(power_saving_memory_weight(hosts, vm(), {})) == [667.0, 213.0]
    # on its current host the VM needs nothing more: 4096 -> int(4096 / 4505.6 x 999) + 1 = 909
    assert w(power_saving_memory_weight(hosts, vm(current_host="h1"), {}))[0] == 909.0
    full = hosts_n(3, physical_mem_mb=0, mem_free_mb=0)
    assert w(power_saving_memory_weight(full, vm(), {})) == [1000.0] * 3


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 4096), min_size=1, max_size=8))
def test_power_saving_memory_orders_opposite_to_even_memory(committed: list[int]) -> None:
    """Among hosts the VM fits on, more free memory is never better for power saving, never worse
    for even distribution; all weights stay in [1, 1000]."""
    hosts = table(*(host(f"h{i}", mem_committed_mb=c) for i, c in enumerate(committed)))
    ps = power_saving_memory_weight(hosts, vm(), {})
    even = even_memory_weight(hosts, vm(), {})
    assert ((ps >= 1) & (ps <= 1000)).all()
    fits = [i for i, c in enumerate(committed) if 4096 - c >= 1088]
    for a in fits:
        for b in fits:
            if committed[a] < committed[b]:  # a has more free memory
                assert ps[a] >= ps[b]
                assert even[a] <= even[b]
    for i, c in enumerate(committed):
        if 4096 - c < 1088:
            assert ps[i] == 1000.0  # a host the VM does not fit on ranks last
    assert EVEN_MEMORY.weight is even_memory_weight


# ------------------------------------------------------------------------------------ OptimalForHaReservation
def test_ha_reservation_hand_computed() -> None:
    hosts = ha_cluster(table(host("none"), host("one", ha_vm_count=1), host("three", ha_vm_count=3)))
    # fitted: round(0/3 x 100) = 0, round(33.3) = 33, 100
    assert w(ha_reservation_weight(hosts, vm(ha=True), {**ON, "ScaleDown": "1"})) == [0.0, 33.0, 100.0]
    # ScaleDown 10: ceil(3.3) = 4, 10
    assert w(ha_reservation_weight(hosts, vm(ha=True), {**ON, "ScaleDown": "10"})) == [0.0, 4.0, 10.0]


def test_ha_reservation_java_rounding_and_ceil() -> None:
    hosts = ha_cluster(table(host("two", ha_vm_count=2), host("three", ha_vm_count=3)))
    # round(2/3 x 100) = round(66.67) = 67; ScaleDown 2 -> ceil(33.5) = 34, ceil(50) = 50
    assert w(ha_reservation_weight(hosts, vm(ha=True), ON)) == [67.0, 100.0]
    assert w(ha_reservation_weight(hosts, vm(ha=True), {**ON, "ScaleDown": "2"})) == [34.0, 50.0]


def test_ha_reservation_neutral_cases() -> None:
    counts = table(host("a", ha_vm_count=1), host("b", ha_vm_count=5))
    assert w(ha_reservation_weight(counts, vm(ha=True), {})) == [0.0, 0.0]  # cluster without reservation
    assert w(ha_reservation_weight(ha_cluster(counts), vm(), ON)) == [0.0, 0.0]  # VM not HA
    assert w(ha_reservation_weight(ha_cluster(hosts_n(3)), vm(ha=True), ON)) == [0.0, 0.0, 0.0]  # no HA VM anywhere


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(1, 100))
def test_ha_reservation_bounds_and_order(counts: list[int], scale: int) -> None:
    hosts = ha_cluster(table(*(host(f"h{i}", ha_vm_count=c) for i, c in enumerate(counts))))
    raw = ha_reservation_weight(hosts, vm(ha=True), {**ON, "ScaleDown": str(scale)})
    assert ((raw >= 0) & (raw <= math.ceil(100 / scale))).all()
    for a in range(len(counts)):
        for b in range(len(counts)):
            if counts[a] < counts[b]:
                assert raw[a] <= raw[b]
    if max(counts) > 0:
        assert raw[counts.index(max(counts))] == math.ceil(100 / scale)


# ------------------------------------------------------------------------------------ PreferredHosts
def test_preferred_hosts() -> None:
    hosts = hosts_n(3)
    assert w(preferred_hosts_weight(hosts, vm(preferred_hosts=["h1"]), {})) == [10000.0, 0.0, 10000.0]
    assert NOT_PREFERRED_WEIGHT == 10000.0
    assert w(preferred_hosts_weight(hosts, vm(preferred_hosts=["h0", "h2"]), {})) == [0.0, 10000.0, 0.0]
    # preferring only hosts outside the table penalizes every host alike
    assert w(preferred_hosts_weight(hosts, vm(preferred_hosts=["elsewhere"]), {})) == [10000.0] * 3


def test_preferred_hosts_neutral_cases() -> None:
    hosts = hosts_n(3)
    assert w(preferred_hosts_weight(hosts, vm(), {})) == [0.0] * 3
    # a migration: preferences apply only at start (oVirt)
    assert w(preferred_hosts_weight(hosts, vm(preferred_hosts=["h1"], current_host="h0"), {})) == [0.0] * 3


@pytest.mark.parametrize("unit", POWER_HA_PREFERENCE_WEIGHTS, ids=lambda u: u.name)
def test_bounds_declared_hold(unit: PolicyUnit) -> None:
    assert unit.weight is not None
    assert unit.maximum is not None
    assert unit.minimum is not None
    hosts = ha_cluster(table(host("a", ha_vm_count=3, mem_committed_mb=4000), host("b"), host("c", ha_vm_count=1)))
    raw = unit.weight(hosts, vm(ha=True, preferred_hosts=["b"]), validate_properties(unit, {}))
    assert ((raw >= unit.minimum) & (raw <= unit.maximum)).all()
