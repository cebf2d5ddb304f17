"""Stamps order by (generation, counter): the property every fence and version check relies on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vmsched.store.generations import MAX_GENERATION, STAMP_SPAN, counter_of, generation_of, stamp

generations = st.integers(0, MAX_GENERATION)
counters = st.integers(0, STAMP_SPAN - 1)


@given(generations, counters, generations, counters)
def test_stamps_compare_as_their_generation_then_counter(g1: int, c1: int, g2: int, c2: int) -> None:
    a, b = stamp(g1, c1), stamp(g2, c2)
    assert (a < b) == ((g1, c1) < (g2, c2))
    assert (a == b) == ((g1, c1) == (g2, c2))


@given(generations, counters)
def test_a_stamp_says_its_generation_and_counter_and_stays_exact_in_a_double(g: int, c: int) -> None:
    s = stamp(g, c)
    assert (generation_of(s), counter_of(s)) == (g, c)
    assert float(s) == s  # Lua's numbers and JSON readers are doubles


@given(generations, counters, counters)
def test_anything_of_a_later_generation_is_newer_than_everything_before(g: int, c_old: int, c_new: int) -> None:
    if g < MAX_GENERATION:
        assert stamp(g + 1, c_new) > stamp(g, c_old)


def test_generation_zero_stamps_are_the_plain_counters() -> None:
    assert [stamp(0, c) for c in (0, 1, 1539)] == [0, 1, 1539]


@pytest.mark.parametrize(("generation", "counter"), [(-1, 0), (MAX_GENERATION + 1, 0), (0, -1), (0, STAMP_SPAN)])
def test_out_of_range_parts_are_refused(generation: int, counter: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        stamp(generation, counter)
