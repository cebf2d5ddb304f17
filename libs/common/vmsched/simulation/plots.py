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

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vmsched.errors import CommandError
from vmsched.simulation.hostseries import HeatMap, HostSeries, Metric, heat_map, scale_top
from vmsched.simulation.plot_page import PolicyRun, heatmap_names, page, summary_table_html
from vmsched.simulation.report import PolicyReport, Sample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from vmsched.simulation.scenarios import Expectation
    from vmsched.simulation.targets import Verdict
    from vmsched.simulation.workload import Workload

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
    ("Power drawn by the hosts powered on", "kW", lambda s: s.power_w / 1000.0, False),
    ("CPU demand not met (hosts' load capped at their CPUs)", "CPUs", lambda s: s.cpu_unmet, False),
    ("vCPUs per CPU of the hosts in use", "vCPU : pCPU", lambda s: s.vcpu_ratio, False),
    ("Memory committed / usable of the hosts in use", "ratio", lambda s: s.mem_ratio, False),
)
#: Samples are drawn as steps: a sample's value holds until the next one (it is what the cluster
#: was at that instant, not a trend between two).
STEPS = "steps-post"


@dataclass(frozen=True)
class Mark:
    """An event drawn across every panel: a vertical line (or a shaded span, for maintenance)."""

    at_s: float
    kind: str
    what: str
    end_s: float | None = None
    #: The policy whose run it happened in (HA alerts), or None for the workload's own events.
    policy: str | None = None


#: kind -> (colour, line style, legend label).
MARK_STYLES: dict[str, tuple[str, str, str]] = {
    "failure": ("#d62728", "-", "host failure"),
    "repair": ("#2ca02c", ":", "host repaired"),
    "maintenance": ("#7f7f7f", "-", "maintenance"),
    "ha_alert": ("#9467bd", "-.", "HA alert"),
}


def marks_of(workload: Workload | None, reports: Sequence[PolicyReport]) -> list[Mark]:
    """The workload's failures, repairs and maintenance windows, and each policy's HA alerts."""
    out: list[Mark] = []
    if workload is not None:
        for f in workload.failures:
            out.append(Mark(f.at_s, "failure", f.host_id))
            if f.repair_s is not None:
                out.append(Mark(f.at_s + f.repair_s, "repair", f.host_id))
        out += [Mark(m.start_s, "maintenance", m.host_id, m.end_s) for m in workload.maintenance]
    for r in reports:
        out += [Mark(at, "ha_alert", "HA alert", policy=r.policy) for at in r.ha_alert_times]
    return out


def _draw_marks(ax: Axes, marks: Sequence[Mark], unit: TimeUnit, *, label: bool) -> None:
    seen: set[str] = set()
    for m in marks:
        colour, style, name = MARK_STYLES[m.kind]
        key = name if m.policy is None else f"{name} ({m.policy})"
        text = key if label and key not in seen else None
        if m.end_s is not None:
            ax.axvspan(m.at_s / unit.seconds, m.end_s / unit.seconds, color=colour, alpha=0.15, label=text, lw=0)
        else:
            ax.axvline(m.at_s / unit.seconds, color=colour, ls=style, lw=1.1, alpha=0.8, label=text)
        seen.add(key)


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
            drawstyle=STEPS,
            label="packing bound (first-fit decreasing)",
        )
        return
    for n, one in enumerate(series):
        t = [at / unit.seconds for at, _ in one]
        label = f"packing bound, {reports[n].policy}"
        colour = COLOURS[n % len(COLOURS)]
        ax.plot(t, [ffd for _, ffd in one], color=colour, lw=widths[n] * 0.6, ls="--", drawstyle=STEPS, label=label)


def legend_labels(reports: Sequence[PolicyReport]) -> list[str]:
    """Each policy's name; one whose every sample equals an earlier policy's says so, since its line
    then hides that one's in every panel."""
    labels = []
    for n, report in enumerate(reports):
        twin = next((r.policy for r in reports[:n] if r.samples == report.samples), None)
        labels.append(report.policy if twin is None else f"{report.policy} (the same as {twin} throughout)")
    return labels


def over_time_figure(title: str, reports: Sequence[PolicyReport], marks: Sequence[Mark] = ()) -> Figure:
    """Every policy's line on each panel, in its own colour, drawn as steps; `marks` across every
    panel; one legend for the figure, below the panels."""
    figure_class = _figure_class()
    from matplotlib.ticker import MaxNLocator

    end_s = max((r.samples[-1].at_s for r in reports if r.samples), default=0.0)
    unit = time_unit(end_s)
    widths = line_widths(len(reports))
    fig = figure_class(figsize=(13, 2.3 * len(PANELS) // 2 + 3), layout="constrained")
    axes = fig.subplots(len(PANELS) // 2, 2, sharex=True)
    for k, (ax, (panel_title, ylabel, value, counts)) in enumerate(zip(axes.flat, PANELS, strict=True)):
        for n, (report, label) in enumerate(zip(reports, legend_labels(reports), strict=True)):
            t = [s.at_s / unit.seconds for s in report.samples]
            colour = COLOURS[n % len(COLOURS)]
            ax.plot(t, [value(s) for s in report.samples], color=colour, lw=widths[n], label=label, drawstyle=STEPS)
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
    for k, ax in enumerate(axes.flat):
        _draw_marks(ax, marks, unit, label=k == 0)
    for ax in axes[-1]:
        ax.set_xlabel(f"simulated time ({unit.name})")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # Below the panels (above them, constrained layout lets the legend and the title overlap), in
    # columns as wide as the longest label allows, so four policies, the bound and the event
    # markers fit the figure's width.
    longest = max((len(label) for label in labels), default=1)
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncols=max(1, min(len(labels), 4, 120 // max(longest, 1))),
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


def render(
    title: str,
    runs: Sequence[PolicyRun],
    *,
    workload: Workload | None = None,
    verdicts: Sequence[Verdict] = (),
    expected: Sequence[Expectation] = (),
) -> dict[str, bytes]:
    """Every picture and index.html, by file name, in the order to write and list them; the
    workload's events and the policies' HA alerts marked, the targets and the workload on the page."""
    require_matplotlib()
    reports = [r.report for r in runs]
    images = {"utilisation.png": png(over_time_figure(title, reports, marks_of(workload, reports)))}
    scale = scales(runs)
    for run, name in zip(runs, heatmap_names(runs), strict=True):
        images[name] = png(heat_figure(title, run.report.policy, run.hosts, scale))
    html_page = page(title, runs, images, verdicts=verdicts, expected=expected, workload=workload)
    return {**images, "index.html": html_page.encode("utf-8")}


__all__ = [
    "INSTALL_HINT",
    "MARK_STYLES",
    "STEPS",
    "Mark",
    "PolicyRun",
    "heat_figure",
    "heatmap_names",
    "marks_of",
    "over_time_figure",
    "page",
    "render",
    "require_matplotlib",
    "summary_table_html",
    "time_unit",
]
