"""`vmsched simulate`: replay a workload (a file, a built-in scenario, or a generated one) against
policies in this process and print, side by side, how each placed it.

The decisions are `vmsched.scheduling.placement.place`'s with the policy's own units, so what a
simulation shows is what the selector would decide; nothing here talks to the servers. With
`--over-bus` the real services make them (tools/simulate_bus.py, which prints with `emit`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vmsched.client import SchedulerClient
from vmsched.contracts.policies import PolicyDocument
from vmsched.errors import CommandError, InvalidRequest, UsageError, VmschedError
from vmsched.policy_client import PolicyClient
from vmsched.scheduling.policy import BUILTIN_POLICIES, Policy
from vmsched.scheduling.policy_docs import policy_of
from vmsched.scheduling.units import REGISTRY
from vmsched.settings import Settings
from vmsched.simulation.engine import effective_policy, simulate
from vmsched.simulation.from_cluster import cluster_policy, cluster_workload
from vmsched.simulation.generator import HOST_MODELS, GeneratorSpec, generate
from vmsched.simulation.hostseries import HostSeries
from vmsched.simulation.plots import PolicyRun, render, require_matplotlib
from vmsched.simulation.report import PolicyReport, Recorder, policy_report, render_table
from vmsched.simulation.scenarios import SCENARIOS, Expectation, expectations, render_expectations, scenario
from vmsched.simulation.targets import Verdict, render_verdicts, verdicts
from vmsched.simulation.traces import TRACE_FORMATS, azure_workload
from vmsched.simulation.workload import HostSpec, Workload, dump_workload, parse_workload, schema_text
from vmsched.simulation.workload_json import read_json_workload
from vmsched_services.tools.clikit import settings
from vmsched_services.tools.inputs import WORKLOAD_CAP, WORKLOAD_YAML_CAP, human, read_bounded, read_chunks_bounded
from vmsched_services.tools.policy_commands import read_set


def read_workload(path: str, cap: int | None = None) -> Workload:
    """A workload file (YAML, JSON or CSV) of at most `cap` bytes (default: WORKLOAD_CAP for JSON and
    CSV, WORKLOAD_YAML_CAP for the rest); too big, and what is wrong with it and where, is a UsageError.
    A .json file is read a MB at a time and its entries checked as they come (workload_json)."""
    hint = "--max-workload-size SIZE reads a bigger one"
    try:
        if path.lower().endswith(".json") and path != "-":
            chunks = read_chunks_bounded(
                path, cap or WORKLOAD_CAP, "workload file", "JSON and CSV workloads", hint=hint
            )
            return read_json_workload(chunks, path)
        if cap is not None:
            text = read_bounded(path, cap, "workload file", "workloads", hint=hint)
        elif path.lower().endswith(".csv"):
            text = read_bounded(path, WORKLOAD_CAP, "workload file", "JSON and CSV workloads", hint=hint)
        else:
            hint = (
                f"YAML costs ~25 times what JSON does to read: write it as JSON (.json, read up to "
                f"{human(WORKLOAD_CAP)}), or pass --max-workload-size SIZE"
            )
            text = read_bounded(path, WORKLOAD_YAML_CAP, "workload file", "YAML workloads", hint=hint)
        return parse_workload(text, path)
    except InvalidRequest as exc:
        raise UsageError(str(exc), hint="the format is docs/workload.schema.json") from None


async def cluster_snapshot(cluster: str, cfg: Settings, hours: float) -> Workload:
    """`--from-cluster`: the cluster's state from the state tracker and its policy from policy-admin,
    over the bus (from_cluster.cluster_workload), simulated for `hours`."""
    async with SchedulerClient(cfg) as scheduler, PolicyClient(cfg) as policies:
        state = await scheduler.state(cluster)
        listing = await policies.read()
    return cluster_workload(state, cluster_policy(cluster, listing), duration_s=hours * 3600)


def read_trace(fmt: str, path: str, hosts: int, cap: int | None) -> Workload:
    """`--trace azure FILE`: the trace's VMs on `hosts` hosts of the generator's largest model."""
    if fmt not in TRACE_FORMATS:
        raise UsageError(f"--trace {fmt}: not a trace format this reads", hint="formats: " + ", ".join(TRACE_FORMATS))
    text = read_bounded(
        path, cap or WORKLOAD_CAP, "trace file", "traces", hint="--max-workload-size SIZE reads a bigger one"
    )
    cores, mem_gb, _ = max(HOST_MODELS)
    spec = HostSpec(id="h", count=hosts, cpu_cores=cores, cpu_threads=2 * cores, mem_mb=mem_gb * 1024)
    try:
        return azure_workload(text.splitlines(), path, spec)
    except InvalidRequest as exc:
        raise UsageError(str(exc), hint="the Azure VM table's columns are in docs/simulating.md") from None


def workload_of(args: argparse.Namespace) -> Workload:
    if args.workload:
        return read_workload(args.workload, getattr(args, "max_workload_size", None))
    if getattr(args, "trace", None):
        return read_trace(args.trace[0], args.trace[1], args.hosts, getattr(args, "max_workload_size", None))
    if getattr(args, "from_cluster", None):
        try:
            return asyncio.run(cluster_snapshot(args.from_cluster, settings(), args.hours))
        except InvalidRequest as exc:
            raise UsageError(str(exc), hint="vmsched clusters lists the clusters the state tracker has") from None
    if args.scenario:
        if args.scenario not in SCENARIOS:
            raise UsageError(f"no scenario {args.scenario!r}", hint="scenarios: " + ", ".join(sorted(SCENARIOS)))
        return scenario(args.scenario).workload
    spec = GeneratorSpec(
        hosts=args.hosts, vms=args.vms, hours=args.hours, seed=args.seed, ha_reservation=args.ha_reservation
    )
    return generate(spec)


def policy_names(args: argparse.Namespace) -> list[str]:
    """The --policy options; without any, a built-in scenario's own policies (its `run`)."""
    if args.policy or not getattr(args, "scenario", None) or args.scenario not in SCENARIOS:
        return list(args.policy)
    return list(scenario(args.scenario).run)


def _checked(doc: PolicyDocument, key: str, where: str) -> Policy:
    policy = policy_of(doc, uuid.uuid5(uuid.NAMESPACE_URL, key))
    try:
        policy.validate_against(REGISTRY)
    except VmschedError as exc:
        raise UsageError(f"{where}: {exc}") from None
    return policy


def policies_of(names: list[str], workload: Workload | None = None) -> list[Policy]:
    """Each --policy: a policy the workload comes with, a built-in policy's name, or a policy file
    (`vmsched policy` format) whose every policy is simulated; each is checked against the unit
    catalogue first. Without --policy: the workload's own policies, or `none`."""
    own = {d.name: d for d in workload.policies} if workload is not None else {}
    if not names and own:
        return [_checked(d, f"workload:{d.name}", f"the workload's policy {d.name}") for d in own.values()]
    out: list[Policy] = []
    for name in names or ["none"]:
        if name in own:
            out.append(_checked(own[name], f"workload:{name}", f"the workload's policy {name}"))
            continue
        if name in BUILTIN_POLICIES:
            out.append(BUILTIN_POLICIES[name])
            continue
        if not Path(name).exists():
            raise UsageError(
                f"--policy {name}: neither a built-in policy nor a file",
                hint="built-in: " + ", ".join(BUILTIN_POLICIES) + "".join(f", {n} (the workload's)" for n in own),
            )
        try:
            docs = read_set(name).policies
        except InvalidRequest as exc:
            raise UsageError(str(exc)) from None
        if not docs:
            raise UsageError(f"{name}: the file has no policies")
        out.extend(_checked(doc, f"{name}#{n}", f"{name}: policies.{n}") for n, doc in enumerate(docs))
    seen = [p.name for p in out]
    if len(set(seen)) != len(seen):
        raise UsageError("two --policy options name policies of the same name: " + ", ".join(seen))
    return out


async def run_all(
    workload: Workload, policies: list[Policy], *, per_host: bool = False
) -> list[tuple[PolicyReport, HostSeries | None]]:
    """Each policy's report and, with `per_host`, every host's utilisation over time (for --plot)."""
    hosts = len(workload.host_ids())
    runs = []
    for policy in policies:
        properties = effective_policy(workload, policy).properties
        recorder = Recorder.for_policy(workload, properties, per_host=per_host)
        counts, timing = await simulate(workload, policy, recorder)
        report = policy_report(policy.name, hosts, counts, timing, recorder.samples, properties)
        runs.append((report, recorder.hosts))
    return runs


def write_plots(
    directory: str,
    title: str,
    runs: list[tuple[PolicyReport, HostSeries | None]],
    workload: Workload | None = None,
    judged: Sequence[Verdict] = (),
    expected: Sequence[Expectation] = (),
) -> list[Path]:
    """The PNGs and index.html in `directory` (created); their paths."""
    files = render(
        title,
        [PolicyRun(report, hosts) for report, hosts in runs if hosts is not None],
        workload=workload,
        verdicts=judged,
        expected=expected,
    )
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (out / name).write_bytes(data)
    except OSError as exc:
        raise CommandError(f"{out}: cannot write the plots ({exc.strerror or exc})") from None
    return [out / name for name in files]


def main(args: argparse.Namespace) -> int:
    if args.schema:
        print(schema_text(), end="")
        return 0
    if args.plot:
        require_matplotlib()  # before the simulation, not after it
    workload = workload_of(args)
    policies = policies_of(policy_names(args), workload)
    runs = asyncio.run(run_all(workload, policies, per_host=bool(args.plot)))
    return emit(args, workload, runs)


def emit(
    args: argparse.Namespace,
    workload: Workload,
    runs: list[tuple[PolicyReport, HostSeries | None]],
    *,
    how: str = "",
    json_extra: dict[str, Any] | None = None,
    text_extra: str = "",
) -> int:
    """Print the reports side by side (or as JSON) with the quality targets, write --out and --plot;
    `how` ends the title, `json_extra` joins the JSON and `text_extra` follows the table."""
    reports = [report for report, _ in runs]
    hosts = len(workload.host_ids())
    judged = verdicts(reports)
    expected = expectations(scenario(args.scenario), reports) if getattr(args, "scenario", None) else []
    span = f"{workload.end_s() / 3600:.1f} h"
    title = f"{workload.name}: {hosts} hosts, {len(workload.arrivals)} VM arrivals, {span}{how}"
    plotted = write_plots(args.plot, title, runs, workload, judged, expected) if args.plot else []
    if args.out:
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "report.json").write_text(
                json.dumps(
                    {"workload": workload.name, "policies": [r.as_json() for r in reports], **(json_extra or {})},
                    indent=2,
                )
                + "\n"
            )
            (out / "workload.yaml").write_text(dump_workload(workload))
        except OSError as exc:
            raise CommandError(f"{out}: cannot write the results ({exc.strerror or exc})") from None
    if args.json:
        data = {
            "workload": workload.name,
            "hosts": hosts,
            "policies": [r.as_json(with_samples=False) for r in reports],
            "targets": [v.as_json() for v in judged],
            "expected": [e.as_json() for e in expected],
            **(json_extra or {}),
        }
        print(json.dumps(data, indent=2))
    else:
        print(render_table(title, reports))
        if judged:
            print("\n" + render_verdicts(judged))
        if expected:
            print("\n" + render_expectations(expected))
        if text_extra:
            print(text_extra)
        if args.out:
            print(f"\nreport.json (with every sample) and workload.yaml written to {args.out}")
    if plotted:
        # With --json on stderr, so what stdout carries stays one JSON document.
        print("\nplots written:\n" + "\n".join(f"  {path}" for path in plotted), file=sys.stderr if args.json else None)
    return 0


__all__ = [
    "cluster_snapshot",
    "emit",
    "main",
    "policies_of",
    "policy_names",
    "read_trace",
    "read_workload",
    "run_all",
    "workload_of",
    "write_plots",
]
