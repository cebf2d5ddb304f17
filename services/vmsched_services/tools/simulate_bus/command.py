"""`vmsched simulate --over-bus`: each policy replayed in process and over the bus, reported as
`vmsched simulate` reports, with the comparison under the table."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from vmsched.scheduling.policy import Policy
from vmsched.settings import Settings
from vmsched.simulation.deciding import effective_policy
from vmsched.simulation.hostseries import HostSeries
from vmsched.simulation.plots import require_matplotlib
from vmsched.simulation.report import PolicyReport, Recorder, policy_report
from vmsched.simulation.workload import Workload
from vmsched_services.tools.simulate import emit, policies_of, policy_names, workload_of
from vmsched_services.tools.simulate_bus.compare import BusSummary, summary_of
from vmsched_services.tools.simulate_bus.recording import RecordingSimulation
from vmsched_services.tools.simulate_bus.replaying import replay
from vmsched_services.tools.simulate_bus.stack import services


@dataclass(frozen=True)
class OverBus:
    """What `vmsched simulate --over-bus` reports: each policy's replay over the bus, compared."""

    runs: list[tuple[PolicyReport, HostSeries | None]]
    summaries: list[BusSummary]
    started: list[str]


async def run_over_bus(
    settings: Settings, workload: Workload, policies: Sequence[Policy], *, per_host: bool = False
) -> OverBus:
    """Each policy replayed in process, then over the bus (its report is the bus replay's; with
    `per_host`, every host's utilisation over time too, for --plot)."""
    hosts = len(workload.host_ids())
    runs: list[tuple[PolicyReport, HostSeries | None]] = []
    summaries: list[BusSummary] = []
    async with services(settings) as svc:
        for policy in policies:
            local = RecordingSimulation(workload, policy)
            await local.run()
            properties = effective_policy(workload, policy).properties
            recorder = Recorder.for_policy(workload, properties, per_host=per_host)
            bus = await replay(svc, workload, policy, recorder)
            report = policy_report(
                policy.name, hosts, bus.counts, bus.timing(), recorder.samples, bus.policy.properties
            )
            runs.append((report, recorder.hosts))
            summaries.append(summary_of(policy.name, local, bus))
        started = list(svc.started)
    return OverBus(runs, summaries, started)


def main(args: argparse.Namespace, settings: Settings) -> int:
    """`vmsched simulate --over-bus`: the workload and policies as `vmsched simulate` reads them."""
    workload = workload_of(args)
    if args.plot:
        require_matplotlib()  # before the replay, not after it
    policies = policies_of(policy_names(args), workload)
    result = asyncio.run(run_over_bus(settings, workload, policies, per_host=bool(args.plot)))
    extra = {"over_bus": {"services_started": result.started, "policies": [s.as_json() for s in result.summaries]}}
    text = render_over_bus(result)
    return emit(args, workload, result.runs, how=", decided over the bus", json_extra=extra, text_extra=text)


#: Differences listed per policy; the rest are counted.
SHOWN_DIFFERENCES = 5


def render_over_bus(result: OverBus) -> str:
    """The lines under the report's table: per policy, the cost of a decision over the bus against
    in process, and whether the decisions were the same."""
    where = (
        f"services started in this process: {', '.join(result.started)}"
        if result.started
        else "the services already running"
    )
    lines = [f"\nover the bus ({where}); the same replay in process for comparison:"]
    width = max((len(s.policy) for s in result.summaries), default=0)
    for s in result.summaries:
        slower = s.bus_ms_mean / s.in_process_ms_mean if s.in_process_ms_mean > 0 else 0.0
        lines.append(
            f"  {s.policy:<{width}}  {s.decisions} decisions ({s.migration_decisions} for migrations): "
            f"{s.bus_ms_mean:.1f} ms each "
            f"over the bus (p50 {s.bus_ms_p50:.1f}, p99 {s.bus_ms_p99:.1f}; reports and catch-up "
            f"{s.report_ms_mean:.1f}, schedule call {s.call_ms_mean:.1f}), {s.in_process_ms_mean:.2f} ms in process "
            f"({slower:.0f}x); "
            f"replay {s.bus_wall_s:.2f} s against {s.in_process_wall_s:.2f} s"
        )
        if s.identical:
            lines.append(f"  {'':<{width}}  every decision the same as in process")
            continue
        lines.append(
            f"  {'':<{width}}  {len(s.differences)} of {s.decisions} decisions differ from in process (a decision "
            "that depends on elapsed time: the services judge it by the wall clock):"
        )
        lines.extend(f"  {'':<{width}}    {d.text()}" for d in s.differences[:SHOWN_DIFFERENCES])
        if len(s.differences) > SHOWN_DIFFERENCES:
            lines.append(f"  {'':<{width}}    and {len(s.differences) - SHOWN_DIFFERENCES} more")
    return "\n".join(lines)


__all__ = ["SHOWN_DIFFERENCES", "OverBus", "main", "render_over_bus", "run_over_bus"]
