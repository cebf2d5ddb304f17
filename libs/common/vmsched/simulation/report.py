"""What a simulation measured, per policy: packing (hosts used against first-fit-decreasing on the
same demand), evenness (utilisation spread), energy, CPU demand not met and time over
HighUtilization, overcommit, placement failures (HA restarts apart) and why, and speed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from vmsched.scheduling.hosts import FloatArray, HostTable, IndexArray
from vmsched.scheduling.units.balance_load import DEFAULT_HIGH
from vmsched.simulation.figures import J_PER_KWH, durations, integral, ratio
from vmsched.simulation.hostseries import HostSeries, Metric
from vmsched.simulation.operator_figures import Operator, operator_figures
from vmsched.simulation.packing_bound import bins_of, ffd_bins, headroom_of, lower_bound, spread_floor
from vmsched.simulation.power import power_model
from vmsched.simulation.records import Counts, Snapshot, Timing
from vmsched.simulation.workload import Workload


# ------------------------------------------------------------------------------ samples
@dataclass(frozen=True)
class Sample:
    at_s: float
    vms: int
    hosts_used: int
    ffd_hosts: int
    cpu_spread: float
    cpu_std: float
    mem_spread: float
    mem_std: float
    #: Most VMs on a host minus fewest (hosts not down).
    vm_count_spread: int
    #: Most highly available VMs on one host.
    ha_per_host_max: int
    #: Mean CPU % and memory % of the hosts in use (with VMs): how full packing makes them.
    cpu_mean_in_use: float
    mem_mean_in_use: float
    #: Hosts not failed and not powered off (what the datacenter pays power for).
    hosts_on: int = 0
    #: Most VMs on a host (hosts not down).
    vm_count_max: int = 0
    #: CPUs of the hosts used, and of the hosts first-fit-decreasing uses (largest first): with
    #: hosts of several sizes, hosts used can be twice the bound while the CPUs are close to it.
    cpus_used: float = 0.0
    ffd_cpus: float = 0.0
    #: Busiest host's CPU % (hosts not down).
    cpu_max: float = 0.0
    #: Watts drawn by the hosts powered on (power.watts), and the idle watts of those powered off
    #: (what they would draw had they stayed on, idle).
    power_w: float = 0.0
    off_idle_w: float = 0.0
    #: CPUs the VMs want (before a host's load is capped at 100 %) and of them, CPUs no host gave.
    cpu_wanted: float = 0.0
    cpu_unmet: float = 0.0
    #: Hosts powered on above HighUtilization (the SLA figure).
    hosts_over_high: int = 0
    #: vCPUs per CPU and memory committed per usable memory: of the hosts in use together, and the
    #: highest of one host.
    vcpu_ratio: float = 0.0
    vcpu_ratio_max: float = 0.0
    mem_ratio: float = 0.0
    mem_ratio_max: float = 0.0
    #: The fewest hosts any packing of the demand needs (`lower_bound`), same headroom as FFD's.
    lb_hosts: int = 0
    #: The largest VM's CPU load in points of the largest host's CPU %, and the CPU spread no
    #: placement can go under with it (`spread_floor`).
    cpu_vm_max: float = 0.0
    cpu_spread_floor: float = 0.0


def utilisation(table: HostTable, idx: IndexArray) -> tuple[FloatArray, FloatArray]:
    """CPU % and memory % (committed of what VMs may use) of the hosts at `idx`."""
    usable = np.maximum(table.physical_mem_mb[idx] - table.reserved_mem_mb[idx], 1.0)
    return table.cpu_usage_pct[idx], 100.0 * table.mem_committed_mb[idx] / usable


def sample_of(
    snapshot: Snapshot,
    vcpus_per_cpu: float | None = None,
    operator: Operator | None = None,
    cpu_limit_pct: float = 100.0,
) -> Sample:
    table = snapshot.table
    idx = table.index_of(snapshot.alive)
    in_use = table.vm_count[idx] > 0
    used = int(in_use.sum())
    bins = bins_of(table, snapshot.alive, vcpus_per_cpu, cpu_limit_pct)
    ffd_used, _ = ffd_bins(snapshot.demand, bins)
    ffd_cpus = sum((bins[ffd_used, 2] / cpu_limit_pct).tolist())
    cpus_used = float(table.effective_cpus[idx][in_use].sum())
    cpu, mem = utilisation(table, idx)
    vm_max, floor = spread_floor(snapshot.demand, table.effective_cpus[idx], cpu)
    return Sample(
        at_s=snapshot.at_s,
        vms=int(table.vm_count.sum()),
        hosts_used=used,
        ffd_hosts=int(ffd_used.sum()),
        cpu_spread=float(cpu.max() - cpu.min()) if len(idx) else 0.0,
        cpu_std=float(cpu.std()) if len(idx) else 0.0,
        mem_spread=float(mem.max() - mem.min()) if len(idx) else 0.0,
        mem_std=float(mem.std()) if len(idx) else 0.0,
        vm_count_spread=int(table.vm_count[idx].max() - table.vm_count[idx].min()) if len(idx) else 0,
        ha_per_host_max=int(table.ha_vm_count.max()) if len(table) else 0,
        cpu_mean_in_use=float(cpu[in_use].mean()) if used else 0.0,
        mem_mean_in_use=float(mem[in_use].mean()) if used else 0.0,
        hosts_on=len(snapshot.alive) - len(snapshot.off.intersection(snapshot.alive)),
        vm_count_max=int(table.vm_count[idx].max()) if len(idx) else 0,
        cpus_used=cpus_used,
        ffd_cpus=ffd_cpus,
        lb_hosts=lower_bound(snapshot.demand, bins),
        cpu_vm_max=vm_max,
        cpu_spread_floor=floor,
        **operator_figures(snapshot, idx, operator or Operator()),
    )


class Recorder:
    """The sampler a simulation calls: keeps one Sample per sample instant and, with `per_host`,
    every host's CPU %, memory % and VM count (bounded in time: HostSeries) for the heat maps."""

    def __init__(
        self,
        vcpus_per_cpu: float | None = None,
        *,
        per_host: bool = False,
        operator: Operator | None = None,
        cpu_limit_pct: float = 100.0,
    ) -> None:
        self.vcpus_per_cpu = vcpus_per_cpu
        self.operator = operator or Operator()
        #: The CPU headroom the packing bounds give each host (the policy's HighUtilization).
        self.cpu_limit_pct = cpu_limit_pct
        self.samples: list[Sample] = []
        self.hosts: HostSeries | None = HostSeries() if per_host else None

    @classmethod
    def for_policy(cls, workload: Workload, properties: Mapping[str, str], *, per_host: bool = False) -> Recorder:
        """The recorder of one policy's run of `workload`, its HighUtilization read once: the SLA line
        of the operator figures (80, the unit's default, when unset) and the CPU headroom the packing
        bounds fill hosts to (all of a CPU when unset: a policy without it packs to the full host)."""
        value = properties.get("HighUtilization")
        operator = Operator(power_model(workload), float(value or DEFAULT_HIGH))
        return cls(
            workload.cluster.vcpus_per_cpu,
            per_host=per_host,
            operator=operator,
            cpu_limit_pct=headroom_of(properties),
        )

    def __call__(self, snapshot: Snapshot) -> None:
        self.samples.append(sample_of(snapshot, self.vcpus_per_cpu, self.operator, self.cpu_limit_pct))
        if self.hosts is not None:
            table = snapshot.table
            cpu, mem = utilisation(table, np.arange(len(table)))
            down = np.ones(len(table), dtype=np.bool_)
            down[table.index_of(snapshot.alive)] = False
            down[table.index_of(sorted(snapshot.off))] = True  # powered off: nothing to show either
            values: dict[Metric, FloatArray] = {"cpu": cpu, "mem": mem, "vms": table.vm_count}
            self.hosts.add(snapshot.at_s, table.ids, values, down)


# ------------------------------------------------------------------------------ the report
@dataclass(frozen=True)
class PolicyReport:
    policy: str
    hosts: int
    arrivals: int
    placed: int
    #: Arrivals not placed (HA restarts that failed are `restart_failures`, apart).
    failed: int
    #: Filter -> failed placements of arrivals in which it removed hosts.
    failure_reasons: dict[str, int]
    #: The first few distinct failure summaries, as the decisions said them.
    failure_examples: list[str]
    departures: int
    host_failures: int
    #: VMs on hosts when they failed; HA ones restarted elsewhere, and HA ones no host took.
    vms_lost: int
    ha_restarted: int
    ha_vms_lost: int
    #: VMs whose host went down while they started.
    starts_lost: int
    hosts_used_mean: float
    hosts_used_max: int
    hosts_used_final: int
    #: Hosts powered on (not failed, not powered off by power actions), mean over samples with VMs.
    hosts_on_mean: float
    ffd_hosts_mean: float
    ffd_hosts_final: int
    #: Mean over samples with VMs of hosts used / FFD hosts (1.0: as tight as the packing bound).
    packing_ratio_mean: float
    packing_ratio_max: float
    #: Mean over samples with VMs of CPUs of the hosts used / CPUs of the hosts FFD uses.
    cpu_capacity_ratio_mean: float
    cpu_spread_mean: float
    cpu_spread_max: float
    cpu_std_mean: float
    mem_spread_mean: float
    mem_spread_max: float
    mem_std_mean: float
    vm_count_spread_final: int
    vm_count_max_final: int
    ha_per_host_max_final: int
    #: Spreads (max-min %) averaged over the samples with VMs in the first and in the last quarter
    #: of the run: what balancing made of the placements' spread.
    cpu_spread_first_quarter: float
    cpu_spread_last_quarter: float
    mem_spread_first_quarter: float
    mem_spread_last_quarter: float
    balance_passes: int
    #: Migrations completed; per host per simulated hour.
    migrations: int
    migrations_per_host_hour: float
    migrations_unplaced: int
    migrations_aborted: int
    #: Migrations back to a host the VM left within its cool-down (should be 0), and at any time.
    ping_pongs: int
    returns: int
    power_advice: int
    power_offs: int
    power_ons: int
    #: Migrations draining hosts for maintenance, and drain attempts that found no target.
    drain_migrations: int
    drain_unplaced: int
    #: HA-reservation checks (with ha_reservation): run, failed, alerts, recoveries, most hosts named.
    ha_checks: int
    ha_checks_failed: int
    ha_alerts: int
    ha_recoveries: int
    ha_failing_hosts_max: int
    sim_hours: float
    wall_s: float
    #: Of wall_s, the sampler's (the packing bound, the spreads).
    sampling_s: float
    vm_events: int
    #: VM events (arrivals and departures) per wall second of the simulation without the sampler.
    vm_events_per_s: float
    speedup: float
    #: HA VMs whose restart after their host failed found no host, and the filters that refused.
    restart_failures: int = 0
    restart_failure_reasons: dict[str, int] = field(default_factory=dict)
    #: used / FFD as a ratio of the means (the mean of ratios, packing_ratio_mean, is dominated
    #: by nearly empty samples).
    packing_ratio_of_means: float = 0.0
    #: Energy of the hosts powered on, kWh; what the hosts powered off would have drawn idle.
    energy_kwh: float = 0.0
    energy_saved_kwh: float = 0.0
    power_kw_mean: float = 0.0
    #: CPU-hours the VMs wanted, and of them not given (a host's load capped at its CPUs).
    cpu_hours_wanted: float = 0.0
    cpu_hours_unmet: float = 0.0
    #: Host-hours above HighUtilization (the SLA figure), and the HighUtilization used.
    host_hours_over_high: float = 0.0
    high_utilization_pct: float = 80.0
    #: vCPUs per CPU and memory committed / usable of the hosts in use: mean over samples with VMs,
    #: and the highest of one host at any sample.
    vcpu_ratio_mean: float = 0.0
    vcpu_ratio_max: float = 0.0
    mem_overcommit_mean: float = 0.0
    mem_overcommit_max: float = 0.0
    #: When each HA alert was raised (simulated s).
    ha_alert_times: list[float] = field(default_factory=list)
    #: The policy's properties as simulated (the workload's defaults and overrides applied).
    properties: dict[str, str] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    #: Balancing passes that started no migration, by why (no imbalance, not held, gain, budget).
    idle: dict[str, int] = field(default_factory=dict)

    def as_json(self, *, with_samples: bool = True) -> dict[str, Any]:
        data = asdict(self)
        if not with_samples:
            del data["samples"]
        return data


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _max(values: Sequence[float]) -> float:
    return float(np.max(values)) if values else 0.0


def policy_report(
    policy: str,
    hosts: int,
    counts: Counts,
    timing: Timing,
    samples: Sequence[Sample],
    properties: Mapping[str, str] | None = None,
) -> PolicyReport:
    reasons: Counter[str] = Counter()
    restart_reasons: Counter[str] = Counter()
    examples: list[str] = []
    for f in counts.failures:
        (restart_reasons if f.restart else reasons).update(f.filters)
        if f.summary not in examples and len(examples) < 3:
            examples.append(f.summary)
    restarts_failed = sum(1 for f in counts.failures if f.restart)
    held = durations(samples, timing.sim_s)
    high = float((properties or {}).get("HighUtilization", "80"))
    busy = [s for s in samples if s.vms > 0]
    ratios = [s.hosts_used / s.ffd_hosts for s in busy if s.ffd_hosts > 0]
    capacity = [s.cpus_used / s.ffd_cpus for s in busy if s.ffd_cpus > 0]
    last = samples[-1] if samples else None
    quarter = timing.sim_s / 4.0
    first_q = [s for s in busy if s.at_s <= quarter]
    last_q = [s for s in busy if s.at_s >= timing.sim_s - quarter]
    host_hours = hosts * timing.sim_s / 3600.0
    wall = max(timing.wall_s, 1e-9)
    engine = max(timing.wall_s - timing.sampling_s, 1e-9)
    return PolicyReport(
        policy=policy,
        hosts=hosts,
        arrivals=counts.arrivals,
        placed=counts.placed,
        failed=len(counts.failures) - restarts_failed,
        restart_failures=restarts_failed,
        restart_failure_reasons=dict(restart_reasons.most_common()),
        packing_ratio_of_means=round(ratio(_mean([s.hosts_used for s in busy]), _mean([s.ffd_hosts for s in busy])), 3),
        energy_kwh=round(integral([s.power_w for s in samples], held) / J_PER_KWH, 3),
        energy_saved_kwh=round(integral([s.off_idle_w for s in samples], held) / J_PER_KWH, 3),
        power_kw_mean=round(ratio(integral([s.power_w for s in samples], held), sum(held)) / 1000.0, 3),
        cpu_hours_wanted=round(integral([s.cpu_wanted for s in samples], held) / 3600.0, 3),
        cpu_hours_unmet=round(integral([s.cpu_unmet for s in samples], held) / 3600.0, 3),
        host_hours_over_high=round(integral([s.hosts_over_high for s in samples], held) / 3600.0, 3),
        high_utilization_pct=high,
        vcpu_ratio_mean=round(_mean([s.vcpu_ratio for s in busy]), 3),
        vcpu_ratio_max=round(_max([s.vcpu_ratio_max for s in busy]), 3),
        mem_overcommit_mean=round(_mean([s.mem_ratio for s in busy]), 3),
        mem_overcommit_max=round(_max([s.mem_ratio_max for s in busy]), 3),
        ha_alert_times=list(counts.ha_alert_times),
        failure_reasons=dict(reasons.most_common()),
        failure_examples=examples,
        departures=counts.departures,
        host_failures=counts.host_failures,
        vms_lost=counts.vms_lost,
        ha_restarted=counts.ha_restarted,
        ha_vms_lost=counts.ha_vms_lost,
        starts_lost=counts.starts_lost,
        hosts_used_mean=round(_mean([s.hosts_used for s in busy]), 2),
        hosts_used_max=max((s.hosts_used for s in samples), default=0),
        hosts_used_final=last.hosts_used if last else 0,
        hosts_on_mean=round(_mean([s.hosts_on for s in busy]), 2),
        ffd_hosts_mean=round(_mean([s.ffd_hosts for s in busy]), 2),
        ffd_hosts_final=last.ffd_hosts if last else 0,
        packing_ratio_mean=round(_mean(ratios), 3),
        packing_ratio_max=round(_max(ratios), 3),
        cpu_capacity_ratio_mean=round(_mean(capacity), 3),
        cpu_spread_mean=round(_mean([s.cpu_spread for s in busy]), 2),
        cpu_spread_max=round(_max([s.cpu_spread for s in busy]), 2),
        cpu_std_mean=round(_mean([s.cpu_std for s in busy]), 2),
        mem_spread_mean=round(_mean([s.mem_spread for s in busy]), 2),
        mem_spread_max=round(_max([s.mem_spread for s in busy]), 2),
        mem_std_mean=round(_mean([s.mem_std for s in busy]), 2),
        vm_count_spread_final=last.vm_count_spread if last else 0,
        vm_count_max_final=last.vm_count_max if last else 0,
        ha_per_host_max_final=last.ha_per_host_max if last else 0,
        cpu_spread_first_quarter=round(_mean([s.cpu_spread for s in first_q]), 2),
        cpu_spread_last_quarter=round(_mean([s.cpu_spread for s in last_q]), 2),
        mem_spread_first_quarter=round(_mean([s.mem_spread for s in first_q]), 2),
        mem_spread_last_quarter=round(_mean([s.mem_spread for s in last_q]), 2),
        balance_passes=counts.balance_passes,
        migrations=counts.migrations,
        migrations_per_host_hour=round(counts.migrations / host_hours, 4) if host_hours > 0 else 0.0,
        migrations_unplaced=counts.migrations_unplaced,
        migrations_aborted=counts.migrations_aborted,
        ping_pongs=counts.ping_pongs,
        returns=counts.returns,
        idle=dict(sorted(counts.idle.items())),
        power_advice=counts.power_advice,
        power_offs=counts.power_offs,
        power_ons=counts.power_ons,
        drain_migrations=counts.drain_migrations,
        drain_unplaced=counts.drain_unplaced,
        ha_checks=counts.ha_checks,
        ha_checks_failed=counts.ha_checks_failed,
        ha_alerts=counts.ha_alerts,
        ha_recoveries=counts.ha_recoveries,
        ha_failing_hosts_max=counts.ha_failing_hosts_max,
        sim_hours=round(timing.sim_s / 3600.0, 3),
        wall_s=round(timing.wall_s, 3),
        sampling_s=round(timing.sampling_s, 3),
        vm_events=counts.vm_events,
        vm_events_per_s=round(counts.vm_events / engine, 1),
        speedup=round(timing.sim_s / wall, 1),
        properties=dict(properties or {}),
        samples=list(samples),
    )


def _arrow(before: float, after: float) -> str:
    return f"{before:.1f} -> {after:.1f}"


#: The rows of the side-by-side table: a label and how one policy's report fills its cell.
ROWS: tuple[tuple[str, Callable[[PolicyReport], str]], ...] = (
    ("VMs placed / asked", lambda r: f"{r.placed} / {r.arrivals}"),
    ("placement failures (arrivals)", lambda r: f"{r.failed}"),
    ("HA restarts failed / needed", lambda r: f"{r.restart_failures} / {r.ha_restarted + r.restart_failures}"),
    ("hosts used (mean)", lambda r: f"{r.hosts_used_mean:.1f}"),
    ("hosts used (max / end)", lambda r: f"{r.hosts_used_max} / {r.hosts_used_final}"),
    ("hosts powered on (mean)", lambda r: f"{r.hosts_on_mean:.1f}"),
    ("FFD bound (mean)", lambda r: f"{r.ffd_hosts_mean:.1f}"),
    ("used / FFD (mean of ratios, max)", lambda r: f"{r.packing_ratio_mean:.2f}, {r.packing_ratio_max:.2f}"),
    ("used / FFD (ratio of means)", lambda r: f"{r.packing_ratio_of_means:.2f}"),
    ("CPUs of used / of FFD's hosts (mean)", lambda r: f"{r.cpu_capacity_ratio_mean:.2f}"),
    ("CPU spread max-min % (mean)", lambda r: f"{r.cpu_spread_mean:.1f}"),
    ("CPU spread max-min % (worst)", lambda r: f"{r.cpu_spread_max:.1f}"),
    ("CPU std % (mean)", lambda r: f"{r.cpu_std_mean:.1f}"),
    ("mem spread max-min % (mean)", lambda r: f"{r.mem_spread_mean:.1f}"),
    ("mem spread max-min % (worst)", lambda r: f"{r.mem_spread_max:.1f}"),
    (
        "CPU spread % (1st -> last quarter)",
        lambda r: f"{r.cpu_spread_first_quarter:.1f} -> {r.cpu_spread_last_quarter:.1f}",
    ),
    (
        "mem spread % (1st -> last quarter)",
        lambda r: f"{r.mem_spread_first_quarter:.1f} -> {r.mem_spread_last_quarter:.1f}",
    ),
    ("VM count spread (end)", lambda r: f"{r.vm_count_spread_final}"),
    ("energy kWh (mean kW)", lambda r: f"{r.energy_kwh:,.1f} ({r.power_kw_mean:.1f})"),
    ("kWh saved by power-offs", lambda r: f"{r.energy_saved_kwh:,.1f}"),
    ("CPU-hours unmet / wanted", lambda r: f"{r.cpu_hours_unmet:,.1f} / {r.cpu_hours_wanted:,.0f}"),
    ("host-hours over HighUtilization", lambda r: f"{r.host_hours_over_high:,.1f} (>{r.high_utilization_pct:g}%)"),
    ("vCPU:pCPU of hosts in use (mean, max)", lambda r: f"{r.vcpu_ratio_mean:.2f}, {r.vcpu_ratio_max:.2f}"),
    ("memory committed / usable (mean, max)", lambda r: f"{r.mem_overcommit_mean:.2f}, {r.mem_overcommit_max:.2f}"),
    ("balancing passes", lambda r: f"{r.balance_passes}"),
    ("migrations (no target, dropped)", lambda r: f"{r.migrations} ({r.migrations_unplaced}, {r.migrations_aborted})"),
    ("migrations / host / hour", lambda r: f"{r.migrations_per_host_hour:.4f}"),
    ("ping-pong in cool-down (returns)", lambda r: f"{r.ping_pongs} ({r.returns})"),
    (
        "idle passes: none/not held/gain/budget",
        lambda r: "/".join(
            str(r.idle.get(k, 0))
            for k in ("no imbalance", "imbalance not held long enough", "gain below margin", "budget exhausted")
        ),
    ),
    ("power advice (offs, ons taken)", lambda r: f"{r.power_advice} ({r.power_offs}, {r.power_ons})"),
    ("maintenance drains (no target)", lambda r: f"{r.drain_migrations} ({r.drain_unplaced})"),
    ("HA VMs on one host, most (end)", lambda r: f"{r.ha_per_host_max_final}"),
    ("HA checks failed / run (alerts)", lambda r: f"{r.ha_checks_failed} / {r.ha_checks} ({r.ha_alerts})"),
    ("VMs on failed hosts (HA restarted, lost)", lambda r: f"{r.vms_lost} ({r.ha_restarted}, {r.ha_vms_lost})"),
    ("VMs lost while starting", lambda r: f"{r.starts_lost}"),
    ("simulated hours", lambda r: f"{r.sim_hours:.1f}"),
    ("wall s (of it sampling)", lambda r: f"{r.wall_s:.2f} ({r.sampling_s:.2f})"),
    ("VM events / s (engine)", lambda r: f"{r.vm_events_per_s:,.0f}"),
)


def render_table(title: str, reports: Sequence[PolicyReport]) -> str:
    """One column per policy, side by side, then each policy's failure reasons."""
    header = ["", *(r.policy for r in reports)]
    rows = [header] + [[label, *(cell(r) for r in reports)] for label, cell in ROWS]
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = [title, ""]
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    for r in reports:
        if r.failed:
            reasons = ", ".join(f"{name} {n}" for name, n in r.failure_reasons.items())
            lines.append(f"\n{r.policy}: {r.failed} arrivals not placed; filters that removed hosts: {reasons}")
        if r.restart_failures:
            reasons = ", ".join(f"{name} {n}" for name, n in r.restart_failure_reasons.items())
            lines.append(
                f"\n{r.policy}: {r.restart_failures} HA VMs not restarted; filters that removed hosts: {reasons}"
            )
        if r.failed or r.restart_failures:
            lines.extend(f"  e.g. {e}" for e in r.failure_examples)
    return "\n".join(lines)


__all__ = [
    "Operator",
    "PolicyReport",
    "Recorder",
    "Sample",
    "policy_report",
    "render_table",
    "sample_of",
    "utilisation",
]
