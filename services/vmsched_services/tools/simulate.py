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
import uuid
from pathlib import Path
from typing import Any

from vmsched.errors import CommandError, InvalidRequest, UsageError, VmschedError
from vmsched.scheduling.policy import BUILTIN_POLICIES, Policy
from vmsched.scheduling.policy_docs import policy_of
from vmsched.scheduling.units import REGISTRY
from vmsched.simulation.engine import simulate
from vmsched.simulation.generator import GeneratorSpec, generate
from vmsched.simulation.report import PolicyReport, Recorder, policy_report, render_table
from vmsched.simulation.scenarios import SCENARIOS, load_scenario
from vmsched.simulation.workload import Workload, dump_workload, parse_workload, schema_text
from vmsched_services.tools.policy_commands import read_set


def read_workload(path: str) -> Workload:
    """A workload file (YAML or JSON); what is wrong with it, and where, is a UsageError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None
    try:
        return parse_workload(text, path)
    except InvalidRequest as exc:
        raise UsageError(str(exc), hint="the format is docs/workload.schema.json") from None


def workload_of(args: argparse.Namespace) -> Workload:
    if args.workload:
        return read_workload(args.workload)
    if args.scenario:
        if args.scenario not in SCENARIOS:
            raise UsageError(f"no scenario {args.scenario!r}", hint="scenarios: " + ", ".join(sorted(SCENARIOS)))
        return load_scenario(args.scenario)
    return generate(GeneratorSpec(hosts=args.hosts, vms=args.vms, hours=args.hours, seed=args.seed))


def policies_of(names: list[str]) -> list[Policy]:
    """Each --policy: a built-in policy's name, or a policy file (`vmsched policy` format) whose
    every policy is simulated; each is checked against the unit catalogue first."""
    out: list[Policy] = []
    for name in names or ["none"]:
        if name in BUILTIN_POLICIES:
            out.append(BUILTIN_POLICIES[name])
            continue
        if not Path(name).exists():
            raise UsageError(
                f"--policy {name}: neither a built-in policy nor a file",
                hint="built-in: " + ", ".join(BUILTIN_POLICIES),
            )
        try:
            docs = read_set(name).policies
        except InvalidRequest as exc:
            raise UsageError(str(exc)) from None
        if not docs:
            raise UsageError(f"{name}: the file has no policies")
        for n, doc in enumerate(docs):
            policy = policy_of(doc, uuid.uuid5(uuid.NAMESPACE_URL, f"{name}#{n}"))
            try:
                policy.validate_against(REGISTRY)
            except VmschedError as exc:
                raise UsageError(f"{name}: policies.{n}: {exc}") from None
            out.append(policy)
    seen = [p.name for p in out]
    if len(set(seen)) != len(seen):
        raise UsageError("two --policy options name policies of the same name: " + ", ".join(seen))
    return out


async def run_all(workload: Workload, policies: list[Policy]) -> list[PolicyReport]:
    hosts = len(workload.host_ids())
    reports = []
    for policy in policies:
        recorder = Recorder(workload.cluster.vcpus_per_cpu)
        counts, timing = await simulate(workload, policy, recorder)
        reports.append(policy_report(policy.name, hosts, counts, timing, recorder.samples))
    return reports


def main(args: argparse.Namespace) -> int:
    if args.schema:
        print(schema_text(), end="")
        return 0
    workload = workload_of(args)
    policies = policies_of(args.policy)
    reports = asyncio.run(run_all(workload, policies))
    return emit(args, workload, reports)


def emit(
    args: argparse.Namespace,
    workload: Workload,
    reports: list[PolicyReport],
    *,
    how: str = "",
    json_extra: dict[str, Any] | None = None,
    text_extra: str = "",
) -> int:
    """Print the reports side by side (or as JSON) and write --out; `how` ends the title, `json_extra`
    joins the JSON and `text_extra` follows the table."""
    hosts = len(workload.host_ids())
    span = f"{workload.end_s() / 3600:.1f} h"
    title = f"{workload.name}: {hosts} hosts, {len(workload.arrivals)} VM arrivals, {span}{how}"
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
            **(json_extra or {}),
        }
        print(json.dumps(data, indent=2))
    else:
        print(render_table(title, reports))
        if text_extra:
            print(text_extra)
        if args.out:
            print(f"\nreport.json (with every sample) and workload.yaml written to {args.out}")
    return 0


__all__ = ["emit", "main", "policies_of", "read_workload", "run_all", "workload_of"]
