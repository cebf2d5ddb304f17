"""The one hook through which the request lifecycle reports time: per stage of a request, the wait
for a cluster's lock, and each decision it makes.

The lifecycle owns one `Stages` per handling of a request (a dict, stage -> milliseconds) and hands
it to the hook with every lap; what is kept of it, logged or counted is the hook's business (the
selector's metrics log it with the decision). A group's shared steps (lock wait, state read,
pending write) are lapped for each request of the group.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeAlias

from vmsched.contracts import ScheduleDecision

#: Milliseconds spent per stage by one handling of one request.
Stages: TypeAlias = dict[str, float]


class StageTimer(Protocol):
    def lap(self, stages: Stages, stage: str, seconds: float) -> None:
        """`seconds` more spent in `stage` by the handling that owns `stages`."""

    def lock_waited(self, seconds: float) -> None:
        """One group waited this long for its cluster's lock."""

    def decided(self, decision: ScheduleDecision, stages: Stages, seconds: float) -> None:
        """This handling made `decision` (not a replay of a stored one), `seconds` after it began."""


class StageTimes:
    """A StageTimer that keeps the laps in each handling's Stages (rounded to microseconds) and
    nothing else: the base of the selector's metrics, and enough for tests."""

    def lap(self, stages: Stages, stage: str, seconds: float) -> None:
        stages[stage] = round(stages.get(stage, 0.0) + seconds * 1000, 3)

    def lock_waited(self, seconds: float) -> None:
        return None

    def decided(self, decision: ScheduleDecision, stages: Stages, seconds: float) -> None:
        return None


def lap_all(timer: StageTimer, each: Iterable[Stages], stage: str, since: float) -> None:
    """Lap the time since `since` (time.perf_counter) to `stage` of every handling in `each`."""
    seconds = time.perf_counter() - since
    for stages in each:
        timer.lap(stages, stage, seconds)


@contextmanager
def timed(timer: StageTimer, stages: Stages, stage: str) -> Iterator[None]:
    """Lap the body's time to `stage` of one handling."""
    since = time.perf_counter()
    try:
        yield
    finally:
        timer.lap(stages, stage, time.perf_counter() - since)


__all__ = ["StageTimer", "StageTimes", "Stages", "lap_all", "timed"]
