"""The placement-quality targets, judged from a simulation's reports.

Each target belongs to a built-in policy (or to the simulator's speed) and says what it measures,
the limit, what was measured and whether it was met; a report lists those of the policies it
simulated. The figures are the report's own, so a reader can check every verdict against the
table above it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from vmsched.scheduling.properties import HIGH_VM_COUNT_PROPERTY, MIGRATION_THRESHOLD_PROPERTY
from vmsched.simulation.report import PolicyReport, Sample

#: Samples in the first hour are left out of "after balancing": balancing starts from the
#: placements' state and needs some passes to act.
WARM_UP_S = 3600.0
#: The speed target's scale: this many hosts, this many VM events, within this many seconds.
SPEED_HOSTS = 10_000
SPEED_EVENTS = 100_000
SPEED_LIMIT_S = 60.0
#: evenly_distributed's and even_spread's limit on the CPU max - min spread, points.
SPREAD_LIMIT = 10.0


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
    #: Why it was missed, as far as the report can tell (the main cause); empty when met.
    why: str = ""

    def line(self) -> str:
        mark = "met" if self.met else f"missed by {self.value - self.limit:.2f}"
        if not self.met and self.limit > 0:
            mark += f" ({100.0 * (self.value - self.limit) / self.limit:.0f}%)"
        text = f"{self.policy}: {self.target}: {self.value:.2f} <= {self.limit:g}: {mark} [{self.how}]"
        if not self.met:
            why = self.why or f"measured {self.value:.2f} against a limit of {self.limit:g}"
            text += f"\n      why: {why}"
        return text

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _after_warm_up(report: PolicyReport) -> list[Sample]:
    return [s for s in report.samples if s.at_s >= WARM_UP_S and s.vms > 0]


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _busy_mean(r: PolicyReport, value: str) -> float:
    values = [float(getattr(s, value)) for s in r.samples if s.vms > 0 and s.hosts_used > 0]
    return float(np.mean(values)) if values else 0.0


def _packing_why(r: PolicyReport) -> str:
    cpu, mem = _busy_mean(r, "cpu_mean_in_use"), _busy_mean(r, "mem_mean_in_use")
    high = r.high_utilization_pct
    causes = []
    if r.cpu_capacity_ratio_mean < r.packing_ratio_mean - 0.1:
        causes.append(
            f"it keeps smaller hosts than FFD (CPUs of its hosts / FFD's {r.cpu_capacity_ratio_mean:.2f} against"
            f" hosts {r.packing_ratio_mean:.2f}): it fills small hosts rather than opening large ones"
        )
    if cpu < high - 10 and mem < 90:
        causes.append(
            f"its hosts in use run at CPU {cpu:.0f}% and memory {mem:.0f}% on average, well under"
            f" HighUtilization {high:g}%: it stops short of the headroom"
        )
    if r.packing_ratio_of_means < r.packing_ratio_mean - 0.1:
        causes.append(f"as a ratio of means it is {r.packing_ratio_of_means:.2f}: nearly empty samples weigh in")
    return "; ".join(causes) or f"hosts in use at CPU {cpu:.0f}%, memory {mem:.0f}% on average"


def _power_saving(r: PolicyReport) -> list[Verdict]:
    return [
        # Its churn, cut by the disruption budgets every balance unit obeys.
        *_budget_churn(r),
        Verdict(
            r.policy,
            "hosts used / first-fit-decreasing hosts",
            r.packing_ratio_mean,
            1.05,
            r.packing_ratio_mean <= 1.05,
            f"mean over samples with VMs (ratio of means {r.packing_ratio_of_means:.2f}); CPUs of the hosts used"
            f" / of FFD's {r.cpu_capacity_ratio_mean:.2f}",
            _packing_why(r),
        ),
    ]


def _spread_why(r: PolicyReport) -> str:
    if r.balance_passes == 0:
        return "the policy has no balance unit: nothing evens the hosts after placement"
    if r.migrations == 0:
        busiest = max((s.cpu_max for s in r.samples), default=0.0)
        if r.migrations_unplaced:
            return f"the balance unit picked VMs {r.migrations_unplaced} times and found no target for any"
        return (
            f"{r.balance_passes} balancing passes moved nothing: the busiest host peaked at {busiest:.0f}%, never"
            f" over HighUtilization {r.high_utilization_pct:g}%, the only imbalance the unit acts on"
        )
    return (
        f"{r.migrations} migrations left a spread of {r.cpu_spread_last_quarter:.1f} points in the last quarter"
        f" (placements alone: {r.cpu_spread_first_quarter:.1f} in the first)"
    )


#: tight_packing's limits: hosts used against first-fit-decreasing and against the lower bound.
PACKING_FFD_LIMIT = 1.05
PACKING_LB_LIMIT = 1.15


def _packing_means(r: PolicyReport) -> tuple[float, float, float, int]:
    """Mean hosts used, FFD hosts and lower-bound hosts over the samples with VMs after the first
    hour, and how many samples: a ratio of means, which the nearly empty first samples (1 host
    against 1, or 2 against 1) cannot dominate as they do a mean of ratios."""
    busy = [s for s in r.samples if s.at_s >= WARM_UP_S and s.vms > 0]
    if not busy:
        return 0.0, 0.0, 0.0, 0
    n = len(busy)
    return (
        sum(s.hosts_used for s in busy) / n,
        sum(s.ffd_hosts for s in busy) / n,
        sum(s.lb_hosts for s in busy) / n,
        n,
    )


#: The churn every policy balancing within the disruption budgets is held to: the cluster's default
#: budget, a quarter of its hosts an hour.
BUDGET_CHURN_LIMIT = 0.25


def _churn(r: PolicyReport, limit: float) -> list[Verdict]:
    """Migrations per host per hour within `limit`, and no VM back within its cool-down."""
    return [
        Verdict(
            r.policy,
            "migrations per host per hour",
            r.migrations_per_host_hour,
            limit,
            r.migrations_per_host_hour <= limit,
            f"{r.migrations} migrations, {r.hosts} hosts, {r.sim_hours:g} h",
            f"{r.migrations} migrations in {r.balance_passes} passes, {r.returns} of them back to a host the VM left",
        ),
        Verdict(
            r.policy,
            "VMs migrated back within their cool-down",
            float(r.ping_pongs),
            0.0,
            r.ping_pongs == 0,
            f"{r.returns} returns at any time",
            f"{r.ping_pongs} VMs went back to a host within their cool-down: the cool-down did not hold them",
        ),
    ]


def _budget_churn(r: PolicyReport) -> list[Verdict]:
    """The churn within the disruption budgets' BUDGET_CHURN_LIMIT."""
    return _churn(r, BUDGET_CHURN_LIMIT)


def _tight_packing(r: PolicyReport) -> list[Verdict]:
    """Hosts used against FFD and the lower bound; its consolidation's churn within the budgets."""
    used, ffd, lb, n = _packing_means(r)
    by_ffd = used / ffd if ffd > 0 else 0.0
    by_lb = used / lb if lb > 0 else 0.0
    how = f"ratio of means over {n} samples after the first hour: {used:.2f} hosts used"
    return [
        Verdict(
            r.policy,
            "hosts used / first-fit-decreasing hosts (ratio of means)",
            round(by_ffd, 3),
            PACKING_FFD_LIMIT,
            by_ffd <= PACKING_FFD_LIMIT,
            f"{how}, {ffd:.2f} FFD hosts (HighUtilization headroom)",
            _packing_why(r),
        ),
        Verdict(
            r.policy,
            "hosts used / lower bound ceil(demand / capacity)",
            round(by_lb, 3),
            PACKING_LB_LIMIT,
            by_lb <= PACKING_LB_LIMIT,
            f"{how}, {lb:.2f} lower-bound hosts (largest hosts first, HighUtilization headroom)",
            _packing_why(r),
        ),
        *_budget_churn(r),
    ]


def _spread_verdict(r: PolicyReport) -> Verdict:
    """The CPU spread's 95th percentile after the first hour, over the samples where the limit can
    be met at all: where the largest VM alone keeps its host more than SPREAD_LIMIT points over the
    mean (`Sample.cpu_spread_floor`), no policy gets under the limit, and those samples would decide
    the percentile whatever the policy did. When every sample is such, all are judged."""
    after = _after_warm_up(r)
    spreads = [s.cpu_spread for s in after]
    feasible = [s.cpu_spread for s in after if s.cpu_spread_floor <= SPREAD_LIMIT]
    out = [s for s in after if s.cpu_spread_floor > SPREAD_LIMIT]
    judged = feasible or spreads
    p95 = float(np.percentile(judged, 95)) if judged else 0.0
    how = f"95th percentile of the {len(judged)} samples after the first hour (mean {_mean(judged):.1f})"
    if out:
        largest = max(s.cpu_vm_max for s in out)
        floors = [s.cpu_spread_floor for s in out]
        why = (
            f"no placement gets under {SPREAD_LIMIT:g} there: the largest VM (up to {largest:.1f} points of the"
            f" largest host) keeps its host {min(floors):.1f}-{max(floors):.1f} points over the mean"
        )
        if feasible:
            p95_all = float(np.percentile(spreads, 95))
            how += f"; {len(out)} of {len(spreads)} left out, {why}; over all {len(spreads)}: 95th percentile"
            how += f" {p95_all:.2f} (mean {_mean(spreads):.1f})"
        else:
            how += f"; judged all the same, though in every one {why}"
    return Verdict(
        r.policy,
        "CPU max - min after balancing, points",
        round(p95, 2),
        SPREAD_LIMIT,
        p95 <= SPREAD_LIMIT,
        how,
        _spread_why(r),
    )


def _evenly_distributed(r: PolicyReport) -> list[Verdict]:
    return [_spread_verdict(r), *_churn(r, 1.0)]


def _even_spread(r: PolicyReport) -> list[Verdict]:
    """evenly_distributed's targets, held to the disruption budgets' 0.25 migrations per host per hour."""
    return [_spread_verdict(r), *_budget_churn(r)]


def _vm_evenly_distributed(r: PolicyReport) -> list[Verdict]:
    # The VM-count spread (most VMs on a host - fewest) at the end, held to the rule's own
    # tolerance (fewer than MigrationThreshold apart) whether or not a host is over HighVmCount:
    # the rule acts only above HighVmCount, so below it the spread can grow unchecked, and the
    # target says so rather than calling that balanced.
    high = int(r.properties.get(HIGH_VM_COUNT_PROPERTY, "10"))
    threshold = int(r.properties.get(MIGRATION_THRESHOLD_PROPERTY, "5"))
    spread = r.vm_count_spread_final
    limit = float(threshold - 1)
    if r.vm_count_max_final <= high:
        why = (
            f"no host is over HighVmCount {high} (most {r.vm_count_max_final} VMs), and the even-VM-count rule"
            f" acts only above it: {r.migrations} migrations"
        )
    else:
        why = (
            f"{r.migrations} migrations in {r.balance_passes} passes did not close the gap"
            f" (most {r.vm_count_max_final} VMs on a host)"
        )
    return [
        Verdict(
            r.policy,
            "VM count spread at the end (most VMs on a host - fewest)",
            float(spread),
            limit,
            spread <= limit,
            f"most {r.vm_count_max_final} VMs on a host, HighVmCount {high}, MigrationThreshold {threshold};"
            f" {r.migrations} migrations",
            why,
        )
    ]


def _speed(r: PolicyReport) -> Verdict:
    # The whole run, the report's sampling with it: a day is simulated to read its figures.
    per_event = r.wall_s / r.vm_events if r.vm_events else 0.0
    projected = per_event * SPEED_EVENTS
    return Verdict(
        r.policy,
        f"seconds for {SPEED_EVENTS:,} VM events at {r.hosts:,} hosts",
        round(projected, 2),
        SPEED_LIMIT_S,
        projected <= SPEED_LIMIT_S,
        f"{r.vm_events:,} events in {r.wall_s:.1f} s, {r.sampling_s:.1f} s of it the report's sampling",
        f"{1000.0 * per_event:.2f} ms per VM event; {r.balance_passes} balancing passes and {r.migrations}"
        f" migrations ran in that time too",
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
        elif r.policy == "tight_packing":
            out += _tight_packing(r)
        if r.hosts >= SPEED_HOSTS:
            out.append(_speed(r))
    # A cause is for a miss; a met target's would read as a complaint.
    return [v if not v.met else replace(v, why="") for v in out]


def render_verdicts(found: Sequence[Verdict]) -> str:
    if not found:
        return ""
    return "\n".join(["quality targets:", *(f"  {v.line()}" for v in found)])


__all__ = [
    "BUDGET_CHURN_LIMIT",
    "PACKING_FFD_LIMIT",
    "PACKING_LB_LIMIT",
    "SPEED_EVENTS",
    "SPEED_HOSTS",
    "SPEED_LIMIT_S",
    "SPREAD_LIMIT",
    "WARM_UP_S",
    "Verdict",
    "render_verdicts",
    "verdicts",
]
