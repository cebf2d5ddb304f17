"""The placement-quality targets, judged from a simulation's reports.

Each target belongs to a built-in policy (or to the simulator's speed) and says what it measures,
the limit, what was measured and whether it was met; a report lists those of the policies it
simulated. The figures are the report's own, so a reader can check every verdict against the
table above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vmsched.scheduling.properties import HIGH_VM_COUNT_PROPERTY, MIGRATION_THRESHOLD_PROPERTY
from vmsched.simulation.report import PolicyReport

#: Samples in the first hour are left out of "after balancing": balancing starts from the
#: placements' state and needs some passes to act.
WARM_UP_S = 3600.0
#: The speed target's scale: this many hosts, this many VM events, within this many seconds.
SPEED_HOSTS = 10_000
SPEED_EVENTS = 100_000
SPEED_LIMIT_S = 60.0


@dataclass(frozen=True)
class Verdict:
    policy: str
    target: str
    #: What was measured, in the target's unit, and the limit it is held to (met when value <= limit).
    value: float
    limit: float
    met: bool
    #: How the value was obtained, for the reader.
    how: str

    def line(self) -> str:
        mark = "met" if self.met else f"missed by {self.value - self.limit:.2f}"
        if not self.met and self.limit > 0:
            mark += f" ({100.0 * (self.value - self.limit) / self.limit:.0f}%)"
        return f"{self.policy}: {self.target}: {self.value:.2f} <= {self.limit:g}: {mark} [{self.how}]"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _spread_after_warm_up(report: PolicyReport) -> list[float]:
    return [s.cpu_spread for s in report.samples if s.at_s >= WARM_UP_S and s.vms > 0]


def _power_saving(r: PolicyReport) -> list[Verdict]:
    return [
        # Its churn, cut by the disruption budgets every balance unit obeys.
        Verdict(
            r.policy,
            "migrations per host per hour",
            r.migrations_per_host_hour,
            0.25,
            r.migrations_per_host_hour <= 0.25,
            f"{r.migrations} migrations, {r.hosts} hosts, {r.sim_hours:g} h",
        ),
        Verdict(
            r.policy,
            "VMs migrated back within their cool-down",
            float(r.ping_pongs),
            0.0,
            r.ping_pongs == 0,
            f"{r.returns} returns at any time",
        ),
        Verdict(
            r.policy,
            "hosts used / first-fit-decreasing hosts",
            r.packing_ratio_mean,
            1.05,
            r.packing_ratio_mean <= 1.05,
            f"mean over samples with VMs; CPUs of the hosts used / of FFD's {r.cpu_capacity_ratio_mean:.2f}",
        ),
    ]


def _evenly_distributed(r: PolicyReport) -> list[Verdict]:
    spreads = _spread_after_warm_up(r)
    p95 = float(np.percentile(spreads, 95)) if spreads else 0.0
    return [
        Verdict(
            r.policy,
            "CPU max - min after balancing, points",
            round(p95, 2),
            10.0,
            p95 <= 10.0,
            f"95th percentile of samples after the first hour (mean {np.mean(spreads) if spreads else 0.0:.1f})",
        ),
        Verdict(
            r.policy,
            "migrations per host per hour",
            r.migrations_per_host_hour,
            1.0,
            r.migrations_per_host_hour <= 1.0,
            f"{r.migrations} migrations, {r.hosts} hosts, {r.sim_hours:g} h",
        ),
        Verdict(
            r.policy,
            "VMs migrated back within their cool-down",
            float(r.ping_pongs),
            0.0,
            r.ping_pongs == 0,
            f"{r.returns} returns at any time",
        ),
    ]


def _even_spread(r: PolicyReport) -> list[Verdict]:
    """evenly_distributed's targets, held to the disruption budgets' 0.25 migrations per host per hour."""
    found = _evenly_distributed(r)
    churn = found[1]
    found[1] = Verdict(churn.policy, churn.target, churn.value, 0.25, churn.value <= 0.25, churn.how)
    return found


def _vm_evenly_distributed(r: PolicyReport) -> list[Verdict]:
    # The even-VM-count rule's own notion: a cluster is unbalanced when a host runs more than
    # HighVmCount VMs and another runs at least MigrationThreshold fewer.
    high = int(r.properties.get(HIGH_VM_COUNT_PROPERTY, "10"))
    threshold = int(r.properties.get(MIGRATION_THRESHOLD_PROPERTY, "5"))
    spread = r.vm_count_spread_final
    balanced = r.vm_count_max_final <= high or spread < threshold
    return [
        Verdict(
            r.policy,
            "VM count spread at the end, when a host is over HighVmCount",
            float(spread),
            float(threshold - 1) if r.vm_count_max_final > high else float(max(spread, threshold - 1)),
            balanced,
            f"most {r.vm_count_max_final} VMs on a host, HighVmCount {high}, MigrationThreshold {threshold};"
            f" {r.migrations} migrations",
        )
    ]


def _speed(r: PolicyReport) -> Verdict:
    engine_s = r.wall_s - r.sampling_s
    per_event = engine_s / r.vm_events if r.vm_events else 0.0
    projected = per_event * SPEED_EVENTS
    return Verdict(
        r.policy,
        f"seconds for {SPEED_EVENTS:,} VM events at {r.hosts:,} hosts",
        round(projected, 2),
        SPEED_LIMIT_S,
        projected <= SPEED_LIMIT_S,
        f"{r.vm_events:,} events in {engine_s:.1f} s without the report's sampling",
    )


def verdicts(reports: Sequence[PolicyReport]) -> list[Verdict]:
    """The targets of every simulated built-in policy that has one; the speed target when the
    simulation ran at its scale (SPEED_HOSTS hosts or more)."""
    out: list[Verdict] = []
    for r in reports:
        if r.policy == "power_saving":
            out += _power_saving(r)
        elif r.policy == "evenly_distributed":
            out += _evenly_distributed(r)
        elif r.policy == "even_spread":
            out += _even_spread(r)
        elif r.policy == "vm_evenly_distributed":
            out += _vm_evenly_distributed(r)
        if r.hosts >= SPEED_HOSTS:
            out.append(_speed(r))
    return out


def render_verdicts(found: Sequence[Verdict]) -> str:
    if not found:
        return ""
    return "\n".join(["quality targets:", *(f"  {v.line()}" for v in found)])


__all__ = ["SPEED_EVENTS", "SPEED_HOSTS", "SPEED_LIMIT_S", "WARM_UP_S", "Verdict", "render_verdicts", "verdicts"]
