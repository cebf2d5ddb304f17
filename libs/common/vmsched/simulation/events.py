"""The simulation's event queue: events on the simulated clock, ordered by time, then kind, then
the order they were queued in."""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import Any


class Kind(IntEnum):
    """Event kinds; at one instant they apply in this order (a host repaired at t takes VMs
    arriving at t; a sample sees everything that happened at its instant)."""

    REPAIR = 0
    FAIL = 1
    POWERED_ON = 2
    MAINTENANCE_START = 3
    MAINTENANCE_END = 4
    DEPART = 5
    MIGRATION_DONE = 6
    STARTED = 7
    LOAD = 8
    DRAIN = 9
    RESTART = 10
    ARRIVE = 11
    BALANCE = 12
    HA_CHECK = 13
    SAMPLE = 14


class EventQueue:
    """Events as (simulated second, kind, payload), taken earliest first; events of one instant
    and kind in the order they were pushed."""

    def __init__(self) -> None:
        self._events: list[tuple[float, int, int, Any]] = []
        self._seq = 0

    def push(self, at_s: float, kind: Kind, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at_s, int(kind), self._seq, payload))

    def every(self, first: float, interval: float, end: float, kind: Kind) -> None:
        """`kind` (with no payload) at `first` and every `interval` after it, up to `end`."""
        t = first
        while t <= end:
            self.push(t, kind, None)
            t += interval

    def pop_until(self, end: float) -> tuple[float, Kind, Any] | None:
        """The earliest event if it is due by `end` (removed from the queue), else None."""
        if not self._events or self._events[0][0] > end:
            return None
        at_s, kind, _, payload = heapq.heappop(self._events)
        return at_s, Kind(kind), payload


__all__ = ["EventQueue", "Kind"]
