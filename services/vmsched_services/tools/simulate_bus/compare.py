"""A replay over the bus against the same replay in process: the decisions that differ, and what a
decision cost each way."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from vmsched.contracts import RequestKind
from vmsched_services.tools.simulate_bus.recording import Decided, RecordingSimulation
from vmsched_services.tools.simulate_bus.reporting import BusSimulation
from vmsched_services.tools.stats import percentile


@dataclass(frozen=True)
class Difference:
    """The n-th decision of the two replays, where they differ (None: that replay made fewer)."""

    index: int
    in_process: Decided | None
    over_bus: Decided | None

    def text(self) -> str:
        first = self.over_bus or self.in_process
        assert first is not None

        def host(d: Decided | None) -> str:
            if d is None:
                return "no such decision"
            if d.vm_id != first.vm_id or d.kind is not first.kind:
                return f"[{d.text()}]"
            return d.host_id or "not placed"

        return f"{first.text()}: {host(self.over_bus)} over the bus, {host(self.in_process)} in process"


def differences(in_process: Sequence[Decided], over_bus: Sequence[Decided]) -> list[Difference]:
    """The decisions that differ, position by position (once one differs, the cluster does, and
    later ones may follow)."""
    return [Difference(n, a, b) for n, (a, b) in enumerate(itertools.zip_longest(in_process, over_bus)) if a != b]


@dataclass(frozen=True)
class BusSummary:
    """One policy's replay over the bus against the same replay in process."""

    policy: str
    decisions: int
    #: Of them, balancing migrations' targets asked of the selector (placed or not).
    migration_decisions: int
    #: Wall milliseconds per decision over the bus (reporting + waiting for the tracker + the call).
    bus_ms_mean: float
    bus_ms_p50: float
    bus_ms_p99: float
    #: Of it: reports and the wait for the tracker; the schedule call.
    report_ms_mean: float
    call_ms_mean: float
    #: Wall milliseconds per decision in process, and the whole replays' wall seconds.
    in_process_ms_mean: float
    bus_wall_s: float
    in_process_wall_s: float
    differences: list[Difference]

    @property
    def identical(self) -> bool:
        return not self.differences

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["differences"] = [d.text() for d in self.differences]
        data["identical"] = self.identical
        return data


def _ms(values: Sequence[float]) -> float:
    return round(1000.0 * sum(values) / len(values), 3) if values else 0.0


def summary_of(policy: str, local: RecordingSimulation, bus: BusSimulation) -> BusSummary:
    per = [r + c for r, c in zip(bus.report_s, bus.call_s, strict=True)]
    return BusSummary(
        policy=policy,
        decisions=len(bus.decisions),
        migration_decisions=sum(d.kind is RequestKind.MIGRATE for d in bus.decisions),
        bus_ms_mean=_ms(per),
        bus_ms_p50=round(1000.0 * percentile(per, 50), 3),
        bus_ms_p99=round(1000.0 * percentile(per, 99), 3),
        report_ms_mean=_ms(bus.report_s),
        call_ms_mean=_ms(bus.call_s),
        in_process_ms_mean=_ms(local.decide_s),
        bus_wall_s=round(bus.wall_s, 3),
        in_process_wall_s=round(local.wall_s, 3),
        differences=differences(local.decisions, bus.decisions),
    )


__all__ = ["BusSummary", "Difference", "differences", "summary_of"]
