"""A fault experiment's checks: invariants hold in every run; latency and recovery-time thresholds hold
to their stated bound in a long run and only to a regression's bound in a short one (CI)."""

from __future__ import annotations

from vmsched_services.tools.chaos.base import Result


def _result(latency_s: float, lost: int = 0) -> Result:
    res = Result("probe", {"requests": 1}, figures={"latency_max_s": latency_s, "lost": lost})
    res.check("lost", "==", 0)
    res.check_timing("latency_max_s", "<=", 1.0, short_bound=10.0)
    return res


def test_a_slow_second_fails_only_the_long_run() -> None:
    assert not _result(1.3).judged_as(long=True).passed
    short = _result(1.3).judged_as(long=False)
    assert short.passed
    [timing] = [ch for ch in short.checks if ch.timing]
    assert "misses the long run's <= 1" in str(timing)


def test_a_regression_fails_the_short_run_too() -> None:
    res = _result(12.0).judged_as(long=False)
    assert not res.passed
    assert res.failures() == ["latency_max_s = 12 (want <= 10; misses the long run's <= 1): FAILED"]


def test_an_invariant_is_held_in_every_run() -> None:
    assert not _result(0.1, lost=1).judged_as(long=False).passed
    assert not _result(0.1, lost=1).judged_as(long=True).passed


def test_a_result_not_judged_holds_its_timing_to_the_long_bound() -> None:
    assert not _result(1.3).passed
    assert _result(0.5).as_dict()["checks"][1] == {
        "figure": "latency_max_s",
        "op": "<=",
        "bound": 1.0,
        "applied_bound": 1.0,
        "timing": True,
        "value": 0.5,
        "passed": True,
    }
