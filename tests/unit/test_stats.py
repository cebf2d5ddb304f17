"""The percentile the demo, the bench and the fault suite report."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vmsched_services.tools.stats import percentile

finite = st.floats(allow_nan=False, allow_infinity=False)


def test_nearest_rank_on_known_values() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 5.0
    assert percentile([], 50) == 0.0


@given(st.lists(finite, min_size=1), st.floats(0, 100), st.floats(0, 100))
def test_is_one_of_the_values_and_grows_with_p(values: list[float], p: float, q: float) -> None:
    lo, hi = sorted((p, q))
    assert percentile(values, lo) in values
    assert percentile(values, lo) <= percentile(values, hi)
