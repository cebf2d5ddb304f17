"""`vmsched hosts register --cluster C FILE`: hosts' reports from a file an operator writes (JSON or
YAML: a list of HostReport-shaped entries, or a mapping whose `hosts` is that list), checked whole
before anything is published, then published as the engine would publish them.

An entry's `cluster_id` may be left out (it is --cluster's), and so may `reported_at` (the state
tracker then takes the time it receives the report); a field HostReport does not have is refused,
not dropped as the engine's unknown fields are: in a file a person wrote it is a misspelling.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from vmsched_services.tools.clikit import EXIT_OK, UsageError, settings
from vmsched_services.tools.inputs import HOSTS_CAP, read_bounded

if TYPE_CHECKING:
    from vmsched.contracts import HostReport

#: Problems listed before "and N more".
SHOWN_PROBLEMS = 20


def _entry_problems(n: int, entry: Any, cluster: str, fields: set[str]) -> tuple[HostReport | None, list[str]]:
    """Entry `n` (counted from 1) as a HostReport, or what is wrong with it, field by field."""
    from pydantic import ValidationError

    from vmsched.contracts import HostReport

    if not isinstance(entry, dict):
        return None, [f"entry {n}: expected a mapping of a host's fields, not {type(entry).__name__}"]
    where = f"entry {n}" + (f" (host {entry['host_id']})" if isinstance(entry.get("host_id"), str) else "")
    problems = [f"{where}: {name}: not a field of a host report" for name in sorted(set(entry) - fields, key=str)]
    if entry.setdefault("cluster_id", cluster) != cluster:
        problems.append(
            f"{where}: cluster_id: {entry['cluster_id']!r} is not the cluster named by --cluster, {cluster}"
        )
    if problems:
        return None, problems
    try:
        return HostReport.model_validate(entry), []
    except ValidationError as exc:
        return None, [f"{where}: {'.'.join(map(str, e['loc'])) or '(the entry)'}: {e['msg']}" for e in exc.errors()]


def read_hosts(path: str, cluster: str, cap: int = HOSTS_CAP) -> list[HostReport]:
    """The host reports in `path` ("-": standard input) for `cluster`; a UsageError listing every
    problem (entry number, host, field) when any entry is not a valid host report."""
    from vmsched import bounded_text
    from vmsched.contracts import HostReport

    source = "standard input" if path == "-" else path
    text = read_bounded(path, cap, "host file", "host files", hint="--max-size SIZE reads a bigger one")
    raw = bounded_text.load(text, source)
    if isinstance(raw, dict) and set(raw) == {"hosts"}:
        raw = raw["hosts"]
    if not isinstance(raw, list) or not raw:
        raise UsageError(
            f"{source}: expected a list of hosts (each a mapping of HostReport's fields), or a mapping with "
            "`hosts`: that list",
            hint="contracts/schemas/HostReport.json lists the fields; docs/operating.md has an example",
        )
    fields = set(HostReport.model_fields)
    reports: list[HostReport] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for n, entry in enumerate(raw, 1):
        report, wrong = _entry_problems(n, entry, cluster, fields)
        problems += wrong
        if report is not None:
            if report.host_id in seen:
                problems.append(
                    f"entry {n} (host {report.host_id}): host_id: entry {seen[report.host_id]} is that host too"
                )
            seen.setdefault(report.host_id, n)
            reports.append(report)
    if problems:
        more = f"\n  and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
        listed = "\n".join(f"  {p}" for p in problems[:SHOWN_PROBLEMS])
        raise UsageError(
            f"{source}: {len(problems)} problem(s), nothing published:\n{listed}{more}",
            hint="fix the entries named above (entries are counted from 1)",
        )
    return reports


def cmd_hosts_register(args: argparse.Namespace) -> int:
    from vmsched.client import SchedulerClient

    reports = read_hosts(args.file, args.cluster, args.max_size)  # whole and valid before the bus is opened

    async def go() -> None:
        async with SchedulerClient(settings()) as client:
            for report in reports:
                await client.report_host(report)

    asyncio.run(go())
    print(f"published {len(reports)} host report(s) to cluster {args.cluster}")
    print(
        f"the state tracker applies them in order: `vmsched state --cluster {args.cluster}` shows them",
        file=sys.stderr,
    )
    return EXIT_OK


__all__ = ["cmd_hosts_register", "read_hosts"]
