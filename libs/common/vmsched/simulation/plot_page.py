"""The page of a simulation's plots (index.html): the summary table, the quality targets (met or
missed, and why), a scenario's expected figures against the actual ones, the workload's parameters,
and every image inline, so the one file shows everything."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vmsched.simulation.hostseries import HostSeries
from vmsched.simulation.power import host_watts
from vmsched.simulation.report import ROWS, PolicyReport

if TYPE_CHECKING:
    from vmsched.simulation.scenarios import Expectation
    from vmsched.simulation.targets import Verdict
    from vmsched.simulation.workload import Workload


@dataclass(frozen=True)
class PolicyRun:
    """What the pictures need of one policy's run."""

    report: PolicyReport
    hosts: HostSeries


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "policy"


def heatmap_names(runs: Sequence[PolicyRun]) -> list[str]:
    """A file name per policy, unique even when two names only differ in characters a file name drops."""
    names: list[str] = []
    for run in runs:
        base = f"heatmap-{slug(run.report.policy)}"
        name, n = f"{base}.png", 2
        while name in names:
            name, n = f"{base}-{n}.png", n + 1
        names.append(name)
    return names


# ------------------------------------------------------------------------------ the page
def summary_table_html(reports: Sequence[PolicyReport]) -> str:
    head = "".join(f"<th>{html.escape(r.policy)}</th>" for r in reports)
    body = "\n".join(
        f"<tr><th>{html.escape(label)}</th>" + "".join(f"<td>{html.escape(cell(r))}</td>" for r in reports) + "</tr>"
        for label, cell in ROWS
    )
    return f"<table>\n<thead><tr><th></th>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def _failures_html(reports: Sequence[PolicyReport]) -> str:
    items = []
    for r in reports:
        for what, n, by in (
            ("arrivals not placed", r.failed, r.failure_reasons),
            ("HA VMs not restarted after their host failed", r.restart_failures, r.restart_failure_reasons),
        ):
            if n:
                reasons = ", ".join(f"{name} {k}" for name, k in by.items())
                items.append(
                    f"<li><b>{html.escape(r.policy)}</b>: {n} {what}; filters that removed hosts: "
                    f"{html.escape(reasons)}</li>"
                )
    return f"<ul>{''.join(items)}</ul>" if items else ""


def targets_html(found: Sequence[Verdict]) -> str:
    """The quality targets: each met or missed, the value against the limit, how, and why missed."""
    if not found:
        return "<p>No quality target applies to the policies simulated.</p>"
    rows = "\n".join(
        f'<tr class="{"met" if v.met else "missed"}"><th>{html.escape(v.policy)}</th><th>{html.escape(v.target)}</th>'
        f"<td>{v.value:.2f}</td><td>{v.limit:g}</td><td>{'met' if v.met else 'missed'}</td>"
        f'<td class="text">{html.escape(v.why if not v.met else v.how)}</td></tr>'
        for v in found
    )
    head = (
        "<tr><th>policy</th><th>target</th><th>value</th><th>limit</th><th></th><th>why missed / how measured</th></tr>"
    )
    return f'<table class="targets">\n<thead>{head}</thead>\n<tbody>\n{rows}\n</tbody>\n</table>'


def expected_html(found: Sequence[Expectation]) -> str:
    if not found:
        return ""
    rows = "\n".join(
        f'<tr class="{"met" if e.met else "missed"}"><th>{html.escape(e.policy)}</th><th>{html.escape(e.figure)}</th>'
        f"<td>{html.escape(e.expected)}</td><td>{html.escape(e.actual)}</td>"
        f"<td>{'as expected' if e.met else 'NOT as expected'}</td></tr>"
        for e in found
    )
    head = "<tr><th>policy</th><th>figure</th><th>expected</th><th>actual</th><th></th></tr>"
    return f"<h2>Expected against actual</h2>\n<table>\n<thead>{head}</thead>\n<tbody>\n{rows}\n</tbody>\n</table>"


def workload_params(workload: Workload) -> list[tuple[str, str]]:
    """What the workload was: its name, hosts by model (with their power model), VMs, events, and
    the settings a run depends on."""
    models: dict[tuple[int, int, int, float, float], int] = {}
    for spec in workload.hosts:
        idle, peak = host_watts(spec)
        key = (spec.cpu_cores, spec.cpu_threads, spec.mem_mb, idle, peak)
        models[key] = models.get(key, 0) + spec.count
    hosts = "; ".join(
        f"{n} x {cores} cores ({threads} threads), {mem // 1024} GB, {idle:g}-{peak:g} W"
        for (cores, threads, mem, idle, peak), n in sorted(models.items())
    )
    c = workload.cluster
    out = [
        ("workload", workload.name),
        ("description", workload.description or ""),
        ("hosts", hosts),
        ("VM arrivals / departures", f"{len(workload.arrivals)} / {len(workload.departures)}"),
        ("host failures / maintenance windows", f"{len(workload.failures)} / {len(workload.maintenance)}"),
        ("duration", f"{workload.end_s() / 3600:.2f} h"),
        ("sample / balance interval", f"{workload.sample_interval_s:g} s / {workload.balance_interval_s:g} s"),
        ("start / migration delay", f"{workload.start_delay_s:g} s / {workload.migration_delay_s:g} s"),
        ("load curve", ", ".join(f"{f:g}" for f in workload.load_curve) or "none"),
        (
            "cluster",
            f"memory overcommit {c.memory_overcommit_pct}%, threads as cores {c.count_threads_as_cores},"
            f" HA reservation {c.ha_reservation}, vCPUs per CPU {c.vcpus_per_cpu}",
        ),
        ("policy properties", ", ".join(f"{k}={v}" for k, v in workload.policy_properties.items()) or "none"),
        ("policy defaults", ", ".join(f"{k}={v}" for k, v in workload.policy_defaults.items()) or "none"),
    ]
    return out


def workload_html(workload: Workload | None) -> str:
    if workload is None:
        return ""
    rows = "\n".join(
        f'<tr><th>{html.escape(k)}</th><td class="text">{html.escape(v)}</td></tr>'
        for k, v in workload_params(workload)
    )
    return f"<h2>Workload</h2>\n<table>\n<tbody>\n{rows}\n</tbody>\n</table>"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1450px; color: #222; }
table { border-collapse: collapse; font-size: 14px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; }
td { text-align: right; font-variant-numeric: tabular-nums; }
tbody th { text-align: left; font-weight: normal; }
img { max-width: 100%; border: 1px solid #eee; }
figure { margin: 1em 0 2em; }
figcaption { color: #555; font-size: 14px; }
td.text { text-align: left; max-width: 70em; }
tr.missed td, tr.missed th { background: #fde8e8; }
tr.met td, tr.met th { background: #eaf6ea; }
"""


def page(
    title: str,
    reports: Sequence[PolicyRun],
    images: dict[str, bytes],
    *,
    verdicts: Sequence[Verdict] = (),
    expected: Sequence[Expectation] = (),
    workload: Workload | None = None,
) -> str:
    """The summary table, the targets, what a scenario expected, the workload, and every image,
    inline (base64), so the one file shows everything."""

    def img(name: str, caption: str) -> str:
        data = base64.b64encode(images[name]).decode("ascii")
        return (
            f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(name)}" title="{html.escape(name)}">'
            f"<figcaption>{html.escape(caption)} ({html.escape(name)})</figcaption></figure>"
        )

    policy_reports = [r.report for r in reports]
    heat = [
        img(name, f"{run.report.policy}: each host's CPU, memory and VMs over time, on scales every policy shares")
        for run, name in zip(reports, heatmap_names(reports), strict=True)
    ]
    return "\n".join(
        [
            "<!doctype html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
            summary_table_html(policy_reports),
            _failures_html(policy_reports),
            "<h2>Quality targets</h2>",
            targets_html(verdicts),
            expected_html(expected),
            workload_html(workload),
            "<h2>Over time</h2>",
            img(
                "utilisation.png",
                "every policy over time, each sample held until the next; dashed black: the first-fit-decreasing"
                " packing bound; vertical lines: host failures (red), repairs (green), maintenance (shaded),"
                " HA alerts (purple, in the policy's panel colour)",
            ),
            "<h2>Per host</h2>",
            *heat,
            "</body></html>",
            "",
        ]
    )


__all__ = [
    "PolicyRun",
    "expected_html",
    "heatmap_names",
    "page",
    "slug",
    "summary_table_html",
    "targets_html",
    "workload_html",
    "workload_params",
]
