"""Pictures of a simulation, per policy: utilisation over time (hosts used against the packing
bound, CPU and memory spread, how full the hosts in use are) and per-host heat maps (CPU, memory,
VMs), as PNG images
and one self-contained HTML page that shows them with the summary table.

Everything is rendered to bytes; the command writes the files. matplotlib is an optional dependency
(`pip install 'vmsched[plots]'`), imported only when a picture is drawn, so the simulator and the
rest of vmsched work without it. The data each picture draws is shaped in hostseries.py (heat maps)
or read straight off the samples; this module draws, and puts the pictures in a page.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vmsched.errors import CommandError
from vmsched.simulation.hostseries import HeatMap, HostSeries, Metric, heat_map, scale_top
from vmsched.simulation.report import ROWS, PolicyReport, Sample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'vmsched[plots]'"
#: Policies' colours, in the order they were given (matplotlib's default cycle, colour-blind safe enough).
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
#: Heat map colours: pale for an idle host, dark red for a full one; grey for a host that was down;
#: above 100 % (memory over-committed) its own colour.
HEAT_COLOURS = "YlOrRd"
DOWN_COLOUR = "#b0b0b0"
OVER_COLOUR = "#3b0f70"
DPI = 110


def require_matplotlib() -> None:
    """Fail now, with what to install, rather than after a long simulation."""
    _figure_class()


def _figure_class() -> type[Figure]:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise CommandError("drawing the plots needs matplotlib, which is not installed", hint=INSTALL_HINT) from None
    return Figure


@dataclass(frozen=True)
class PolicyRun:
    """What the pictures need of one policy's run."""

    report: PolicyReport
    hosts: HostSeries


@dataclass(frozen=True)
class TimeUnit:
    name: str
    seconds: float


def time_unit(end_s: float) -> TimeUnit:
    """Minutes for runs of up to three hours (a scenario's events read as "at 55 min"), else hours."""
    return TimeUnit("minutes", 60.0) if end_s <= 3 * 3600 else TimeUnit("hours", 3600.0)


def time_ticks(ax: Axes, unit: TimeUnit, end_s: float) -> None:
    """Ticks at round times, at most about eight: every 6 hours for a day, 12 for three days, 15
    minutes for an hour."""
    from matplotlib.ticker import MultipleLocator

    steps = (1, 2, 3, 4, 6, 12, 24, 48, 168) if unit.name == "hours" else (1, 2, 5, 10, 15, 20, 30, 60)
    span = end_s / unit.seconds
    step = next((s for s in steps if span / s <= 8), steps[-1] * math.ceil(span / (8 * steps[-1])))
    ax.xaxis.set_major_locator(MultipleLocator(step))


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


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return buf.getvalue()


# ------------------------------------------------------------------------------ over time
#: The panels of the over-time figure: title, y label, each policy's line from its samples, and
#: whether the values are counts (whole-number ticks).
PANELS: tuple[tuple[str, str, Callable[[Sample], float], bool], ...] = (
    ("Hosts in use (with VMs)", "hosts", lambda s: s.hosts_used, True),
    ("Hosts powered on (not failed, not powered off)", "hosts", lambda s: s.hosts_on, True),
    ("CPU spread: busiest host - idlest host", "CPU spread (% points)", lambda s: s.cpu_spread, False),
    ("Memory spread: fullest host - emptiest host", "memory spread (% points)", lambda s: s.mem_spread, False),
    ("Mean CPU of the hosts in use", "CPU used (%)", lambda s: s.cpu_mean_in_use, False),
    ("Mean memory of the hosts in use", "memory committed (%)", lambda s: s.mem_mean_in_use, False),
    ("VM count spread: most VMs on a host - fewest", "VMs", lambda s: s.vm_count_spread, True),
    ("Most highly available VMs on one host", "HA VMs", lambda s: s.ha_per_host_max, True),
)


def line_widths(policies: int) -> list[float]:
    """The first policy's line widest, each next one narrower, so where two policies' lines coincide
    (the same placements) both colours still show, one inside the other."""
    if policies <= 1:
        return [1.6]
    return [1.4 + 2.0 * (policies - 1 - n) / (policies - 1) for n in range(policies)]


def _ffd_bound(ax: Axes, reports: Sequence[PolicyReport], unit: TimeUnit, widths: Sequence[float]) -> None:
    """The packing bound: one black line when it is the same for every policy (the usual case: the
    same VMs are live), else each policy's own, dashed in its colour."""
    series = [[(s.at_s, s.ffd_hosts) for s in r.samples] for r in reports]
    if all(one == series[0] for one in series):
        t = [at / unit.seconds for at, _ in series[0]]
        ax.plot(
            t,
            [ffd for _, ffd in series[0]],
            color="black",
            lw=1.2,
            ls="--",
            label="packing bound (first-fit decreasing)",
        )
        return
    for n, one in enumerate(series):
        t = [at / unit.seconds for at, _ in one]
        label = f"packing bound, {reports[n].policy}"
        ax.plot(t, [ffd for _, ffd in one], color=COLOURS[n % len(COLOURS)], lw=widths[n] * 0.6, ls="--", label=label)


def legend_labels(reports: Sequence[PolicyReport]) -> list[str]:
    """Each policy's name; one whose every sample equals an earlier policy's says so, since its line
    then hides that one's in every panel."""
    labels = []
    for n, report in enumerate(reports):
        twin = next((r.policy for r in reports[:n] if r.samples == report.samples), None)
        labels.append(report.policy if twin is None else f"{report.policy} (the same as {twin} throughout)")
    return labels


def over_time_figure(title: str, reports: Sequence[PolicyReport]) -> Figure:
    """Every policy's line on each panel, in its own colour; one legend for the figure."""
    figure_class = _figure_class()
    from matplotlib.ticker import MaxNLocator

    end_s = max((r.samples[-1].at_s for r in reports if r.samples), default=0.0)
    unit = time_unit(end_s)
    widths = line_widths(len(reports))
    fig = figure_class(figsize=(13, 13), layout="constrained")
    axes = fig.subplots(len(PANELS) // 2, 2, sharex=True)
    for k, (ax, (panel_title, ylabel, value, counts)) in enumerate(zip(axes.flat, PANELS, strict=True)):
        for n, (report, label) in enumerate(zip(reports, legend_labels(reports), strict=True)):
            t = [s.at_s / unit.seconds for s in report.samples]
            colour = COLOURS[n % len(COLOURS)]
            ax.plot(t, [value(s) for s in report.samples], color=colour, lw=widths[n], label=label)
        ax.set_title(panel_title, fontsize=11)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.set_xlim(0, end_s / unit.seconds if end_s > 0 else 1)
        peak = max((value(s) for r in reports for s in r.samples), default=0.0)
        if k == 0:  # the packing bound drawn there too
            peak = max(peak, *(s.ffd_hosts for r in reports for s in r.samples))
        # Room above the highest line, which the frame would otherwise half hide when it is flat.
        ax.set_ylim(0, peak * 1.08 if peak > 0 else 1.0)
        if counts:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        time_ticks(ax, unit, end_s)
    _ffd_bound(axes.flat[0], reports, unit, widths)
    for ax in axes[-1]:
        ax.set_xlabel(f"simulated time ({unit.name})")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # Below the panels: above them, constrained layout lets the legend and the title overlap.
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=min(len(labels), 5),
        frameon=False,
        fontsize=11,
        title="where policies' lines coincide, the later one runs inside the earlier, wider one",
        title_fontsize=9,
    )
    fig.suptitle(title, fontsize=13)
    return fig


# ------------------------------------------------------------------------------ heat maps
def _row_ticks(ax: Axes, heat: HeatMap) -> None:
    """A label per row while they fit (about 12 px a label), else every k-th."""
    rows = len(heat.row_labels)
    step = max(1, math.ceil(rows / 45))
    ticks = list(range(0, rows, step))
    ax.set_yticks([r + 0.5 for r in ticks], [heat.row_labels[r] for r in ticks], fontsize=7 if rows > 20 else 9)


@dataclass(frozen=True)
class Scale:
    """A metric's colour scale, the same in every policy's heat map so they compare."""

    top: float
    #: Some value is above `top` (memory over-committed): drawn in its own colour.
    over: bool


#: The heat map panels: metric, title, colour bar label, whether it is a percentage.
HEAT_PANELS: tuple[tuple[Metric, str, str, bool], ...] = (
    ("cpu", "CPU used", "CPU used (%)", True),
    ("mem", "Memory committed", "memory committed (%)", True),
    ("vms", "VMs on the host", "VMs", False),
)


def scales(runs: Sequence[PolicyRun]) -> dict[Metric, Scale]:
    """Each metric's scale over every policy's run: up to a round number above the highest value."""
    out: dict[Metric, Scale] = {}
    for metric, _, _, percent in HEAT_PANELS:
        peak = 0.0
        for run in runs:
            values = heat_map(run.hosts, metric).values
            if values.size and not np.isnan(values).all():
                peak = max(peak, float(np.nanmax(values)))
        top = scale_top(peak, percent=percent)
        out[metric] = Scale(top, peak > top)
    return out


def heat_figure(title: str, policy: str, hosts: HostSeries, scale: dict[Metric, Scale]) -> Figure:
    """CPU, memory and VMs per host over time for one policy, side by side, each on the scale
    `scale` gives it (the same for every policy)."""
    figure_class = _figure_class()
    import matplotlib as mpl

    maps = [heat_map(hosts, metric) for metric, _, _, _ in HEAT_PANELS]
    unit = time_unit(float(maps[0].edges_s[-1]))
    rows = len(maps[0].row_labels)
    fig = figure_class(figsize=(16, min(15.0, max(4.5, 3.0 + 0.17 * rows))), layout="constrained")
    axes = fig.subplots(1, len(HEAT_PANELS), sharey=True)
    for ax, heat, (metric, what, label, _) in zip(axes, maps, HEAT_PANELS, strict=True):
        cmap = mpl.colormaps[HEAT_COLOURS].with_extremes(bad=DOWN_COLOUR, over=OVER_COLOUR)
        top = scale[metric]
        mesh = ax.pcolormesh(
            heat.edges_s / unit.seconds, np.arange(rows + 1), heat.values, cmap=cmap, vmin=0, vmax=top.top
        )
        ax.set_title(what, fontsize=11)
        ax.set_xlabel(f"simulated time ({unit.name})")
        time_ticks(ax, unit, float(heat.edges_s[-1]))
        ax.set_ylim(rows, 0)  # the first host on top
        _row_ticks(ax, heat)
        bar = fig.colorbar(mesh, ax=ax, location="bottom", extend="max" if top.over else "neither", aspect=40)
        bar.set_label(label + (f"; purple: over {top.top:g}" if top.over else ""))
    axes[0].set_ylabel("host" if maps[0].hosts_per_row == 1 else f"hosts, {maps[0].hosts_per_row} per row")
    fig.suptitle(f"{policy}: each host over time (the same colour scales for every policy)\n{title}", fontsize=12)
    note = _heat_note(maps[0])
    if note:
        fig.supxlabel(note, fontsize=9, color="#444444")  # the layout makes room for it, unlike fig.text
    return fig


def _heat_note(heat: HeatMap) -> str:
    parts = ["grey: host down or powered off"] if bool(np.isnan(heat.values).any()) else []
    if heat.samples_per_column > 1:
        parts.append(f"each column: the mean of {heat.samples_per_column} samples")
    if heat.hosts_per_row > 1:
        parts.append(f"each row: the mean of {heat.hosts_per_row} consecutive hosts")
    return "; ".join(parts)


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
        if r.failed:
            reasons = ", ".join(f"{name} {n}" for name, n in r.failure_reasons.items())
            items.append(
                f"<li><b>{html.escape(r.policy)}</b>: {r.failed} not placed; filters that removed hosts: "
                f"{html.escape(reasons)}</li>"
            )
    return f"<ul>{''.join(items)}</ul>" if items else ""


STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1450px; color: #222; }
table { border-collapse: collapse; font-size: 14px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; }
td { text-align: right; font-variant-numeric: tabular-nums; }
tbody th { text-align: left; font-weight: normal; }
img { max-width: 100%; border: 1px solid #eee; }
figure { margin: 1em 0 2em; }
figcaption { color: #555; font-size: 14px; }
"""


def page(title: str, reports: Sequence[PolicyRun], images: dict[str, bytes]) -> str:
    """The summary table and every image, inline (base64), so the one file shows everything."""

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
            "<h2>Over time</h2>",
            img("utilisation.png", "every policy over time; dashed lines: the first-fit-decreasing packing bound"),
            "<h2>Per host</h2>",
            *heat,
            "</body></html>",
            "",
        ]
    )


def render(title: str, runs: Sequence[PolicyRun]) -> dict[str, bytes]:
    """Every picture and index.html, by file name, in the order to write and list them."""
    require_matplotlib()
    images = {"utilisation.png": png(over_time_figure(title, [r.report for r in runs]))}
    scale = scales(runs)
    for run, name in zip(runs, heatmap_names(runs), strict=True):
        images[name] = png(heat_figure(title, run.report.policy, run.hosts, scale))
    return {**images, "index.html": page(title, runs, images).encode("utf-8")}


__all__ = [
    "INSTALL_HINT",
    "PolicyRun",
    "heat_figure",
    "heatmap_names",
    "over_time_figure",
    "page",
    "render",
    "require_matplotlib",
    "summary_table_html",
    "time_unit",
]
