"""The order in which requests waiting for one cluster are decided (pure, no I/O).

The request lifecycle decides the requests queued for a cluster in groups under one lock acquisition.
Which go first, and so get the best hosts when capacity is short:

1. **Effective priority**, higher first: the request's `priority` plus one for every
   `aging_s` seconds it has waited, so a low-priority request is never starved: it overtakes any
   fixed priority in bounded time.
2. **Earliest deadline**, among equal effective priority: a request that must be decided soon goes
   before one that can wait (no deadline counts as the latest).
3. **Smaller first** (memory, then vCPUs), the ones most likely to fit, as a packer would.
4. **Arrival**, so equal requests keep their order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiting:
    """What the order looks at of one waiting request."""

    priority: int
    #: When it joined the queue (any monotonic clock, the same as `now`'s).
    enqueued_at: float
    #: When it must be decided by, on the same clock; None: no deadline.
    deadline: float | None
    mem_mb: int
    vcpus: int


def effective_priority(w: Waiting, now: float, aging_s: float) -> int:
    """The request's priority raised by one per `aging_s` seconds waited."""
    waited = max(0.0, now - w.enqueued_at)
    return w.priority + math.floor(waited / aging_s)


def decision_order(waiting: Sequence[Waiting], now: float, aging_s: float) -> list[int]:
    """Positions into `waiting`, the first to decide first (see the module docstring)."""

    def key(i: int) -> tuple[int, float, int, int, float, int]:
        w = waiting[i]
        deadline = math.inf if w.deadline is None else w.deadline
        return (-effective_priority(w, now, aging_s), deadline, w.mem_mb, w.vcpus, w.enqueued_at, i)

    return sorted(range(len(waiting)), key=key)


__all__ = ["Waiting", "decision_order", "effective_priority"]
