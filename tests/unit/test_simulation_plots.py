"""`vmsched simulate --plot`: the heat maps' data (per-host series kept in bounded time columns,
the host x time matrix, bands of hosts, colour scales) and the files the command writes."""

from __future__ import annotations

import asyncio
import base64
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from vmsched.scheduling.hosts import FloatArray
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.simulation.engine import Counts, Timing, simulate
from vmsched.simulation.hostseries import METRICS, HostSeries, Metric, column_edges, heat_map, scale_top
from vmsched.simulation.plots import PolicyRun, heatmap_names, legend_labels, time_unit
from vmsched.simulation.report import PolicyReport, Recorder, policy_report
from vmsched.simulation.scenarios import load_scenario
from vmsched_services.tools import cli
from vmsched_services.tools import simulate as simulate_command

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTS = ("h1", "h2", "h3")


def add(series: HostSeries, at_s: float, cpu: list[float], down: tuple[bool, ...] = (False, False, False)) -> None:
    """A sample whose memory % is twice the CPU % and VM count a tenth of it, so one check covers all three."""
    values = np.array(cpu, dtype=np.float64)
    metrics: dict[Metric, FloatArray] = {"cpu": values, "mem": 2 * values, "vms": values / 10}
    series.add(at_s, HOSTS, metrics, np.array(down))


# ------------------------------------------------------------------------------ the data
def test_each_sample_is_a_column_and_each_host_a_row() -> None:
    series = HostSeries()
    add(series, 0.0, [10, 20, 30])
    add(series, 300.0, [40, 50, 60])
    add(series, 600.0, [70, 80, 90])
    cpu = heat_map(series, "cpu")
    assert cpu.row_labels == HOSTS
    assert cpu.hosts_per_row == 1
    assert cpu.samples_per_column == 1
    assert cpu.values.tolist() == [[10, 40, 70], [20, 50, 80], [30, 60, 90]]
    assert heat_map(series, "mem").values.tolist() == [[20, 80, 140], [40, 100, 160], [60, 120, 180]]
    assert heat_map(series, "vms").values == pytest.approx(np.array([[1, 4, 7], [2, 5, 8], [3, 6, 9]]))
    # Halfway between samples; the outer edges are the first and last sample.
    assert cpu.edges_s.tolist() == [0.0, 150.0, 450.0, 600.0]


def test_a_down_host_has_no_value_and_counts_only_its_up_samples() -> None:
    series = HostSeries(max_columns=2)
    add(series, 0.0, [10, 20, 30])
    add(series, 1.0, [50, 99, 30], down=(False, True, False))
    add(series, 2.0, [0, 99, 0], down=(False, True, True))  # a new column; merges the first two
    cpu = heat_map(series, "cpu").values
    assert series.samples == [2, 1]
    assert cpu[0].tolist() == [30.0, 0.0]
    assert cpu[1, 0] == 20.0  # its down sample's 99 counts for nothing
    assert np.isnan(cpu[1, 1])  # down throughout the column
    assert cpu[2].tolist()[0] == 30.0
    assert np.isnan(cpu[2, 1])


def test_downsampling_keeps_at_most_max_columns_and_each_columns_mean() -> None:
    series = HostSeries(max_columns=4)
    for k in range(9):
        add(series, 10.0 * k, [k, 2 * k, 100])
        assert len(series) <= 4
    # 1+1+1+1, then pairs (2+2+1, ...), then pairs again: 4, 4 and the ninth sample alone.
    assert series.samples == [4, 4, 1]
    assert series.samples_per_column == 4
    cpu = heat_map(series, "cpu")
    assert cpu.values[0].tolist() == [1.5, 5.5, 8.0]  # means of 0..3, 4..7, 8
    assert cpu.values[1].tolist() == [3.0, 11.0, 16.0]
    assert cpu.values[2].tolist() == [100.0, 100.0, 100.0]
    assert cpu.samples_per_column == 4
    assert cpu.edges_s.tolist() == [0.0, 35.0, 75.0, 80.0]


def test_a_long_run_stays_bounded_and_its_overall_mean_is_kept() -> None:
    series = HostSeries(max_columns=300)
    rng = np.random.default_rng(3)
    values = rng.uniform(0, 100, size=(5000, 3))
    for k, row in enumerate(values):
        add(series, float(k), list(row))
    assert 150 <= len(series) <= 300
    sums, up = series.sums("cpu")
    assert up.sum(axis=1).tolist() == [5000, 5000, 5000]
    assert (sums.sum(axis=1) / 5000) == pytest.approx(values.mean(axis=0), rel=1e-4)


def test_more_hosts_than_rows_are_banded_consecutively_with_the_bands_mean() -> None:
    series = HostSeries()
    ids = ("a", "b", "c", "d", "e")
    down = np.array([False, False, False, True, False])
    for at in (0.0, 1.0):
        cpu = np.array([10.0, 20.0, 60.0, 99.0, 40.0])
        series.add(at, ids, {m: cpu for m in METRICS}, down)
    heat = heat_map(series, "cpu", max_rows=2)
    assert heat.hosts_per_row == 3
    assert heat.row_labels == ("a-c", "d-e")
    assert heat.values.tolist() == [[30.0, 30.0], [40.0, 40.0]]  # d, down, counts for nothing


def test_a_sample_in_another_host_order_is_aligned_and_a_missing_host_is_down() -> None:
    series = HostSeries()
    add(series, 0.0, [10, 20, 30])
    series.add(1.0, ("h3", "h1"), {m: np.array([33.0, 11.0]) for m in METRICS}, np.array([False, False]))
    cpu = heat_map(series, "cpu").values
    assert cpu[:, 1].tolist()[0] == 11.0
    assert np.isnan(cpu[1, 1])
    assert cpu[2, 1] == 33.0


def test_empty_series_and_edges() -> None:
    heat = heat_map(HostSeries(), "cpu")
    assert heat.values.shape == (0, 0)
    assert column_edges([], []).tolist() == [0.0]
    with pytest.raises(ValueError, match="even"):
        HostSeries(max_columns=3)


@pytest.mark.parametrize(
    ("peak", "percent", "top"),
    [
        (0.0, True, 5.0),
        (3.2, True, 5.0),
        (12.0, True, 20.0),
        (60.0, True, 75.0),
        (100.8, True, 100.0),
        (7.2, False, 8.0),
        (0.0, False, 1.0),
    ],
)
def test_colour_scales_end_at_a_round_number_above_the_peak(peak: float, percent: bool, top: float) -> None:
    assert scale_top(peak, percent=percent) == top


def test_time_unit_and_file_names() -> None:
    assert time_unit(7200).name == "minutes"
    assert time_unit(86400).name == "hours"
    reports = [PolicyRun(report_named(name), HostSeries()) for name in ("a b", "a-b", "x/y")]
    assert heatmap_names(reports) == ["heatmap-a-b.png", "heatmap-a-b-2.png", "heatmap-x-y.png"]


def test_a_policy_whose_every_sample_equals_an_earlier_ones_says_so_in_the_legend() -> None:
    reports = [report_named("a"), report_named("b")]
    assert legend_labels(reports) == ["a", "b (the same as a throughout)"]


def report_named(name: str) -> PolicyReport:
    return policy_report(name, 0, Counts(), Timing(sim_s=1.0, wall_s=1.0, sampling_s=0.0), [])


def test_the_recorder_keeps_every_hosts_values_as_the_cluster_had_them() -> None:
    """ha-reservation: sixteen VMs on four hosts, then h1 fails; the VM column sums are the VMs
    running, and h1 has no value once it is down."""
    workload = load_scenario("ha-reservation")
    recorder = Recorder(per_host=True)
    asyncio.run(simulate(workload, BUILTIN_POLICIES["none"], recorder))
    assert recorder.hosts is not None
    vms = heat_map(recorder.hosts, "vms")
    assert vms.row_labels == ("h1", "h2", "h3", "h4")
    assert vms.values.shape == (4, len(recorder.samples))
    assert np.nansum(vms.values, axis=0).tolist() == [s.vms for s in recorder.samples]
    assert not np.isnan(vms.values[0, 0])
    assert np.isnan(vms.values[0, -1])
    assert Recorder().hosts is None  # only when asked: the plain report keeps nothing per host


# ------------------------------------------------------------------------------ the command
def test_simulate_plot_writes_pngs_and_a_page_showing_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots" / "here"
    args = ["simulate", "--scenario", "ha-reservation", "--policy", "none", "--policy", "power_saving"]
    assert cli.main([*args, "--plot", str(out)]) == 0
    printed = capsys.readouterr().out
    names = ["utilisation.png", "heatmap-none.png", "heatmap-power_saving.png"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "index.html"])
    for name in ["index.html", *names]:
        assert str(out / name) in printed
    page = (out / "index.html").read_text(encoding="utf-8")
    embedded = dict(re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]+)"', page))
    shown = {alt: base64.b64decode(data) for data, alt in embedded.items()}
    assert set(shown) == set(names)
    for name in names:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC)
        assert shown[name] == data  # the page shows the very file, with nothing to fetch
    assert "http" not in page
    assert "<td>12 / 12</td>" in page  # the summary table
    assert "<th>power_saving</th>" in page


def test_without_matplotlib_plot_says_what_to_install_before_simulating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # None in sys.modules makes `import matplotlib...` fail as if it were not installed.
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)

    async def not_now(*args: object, **kw: object) -> None:
        raise AssertionError("simulated before finding matplotlib missing")

    monkeypatch.setattr(simulate_command, "run_all", not_now)
    out = tmp_path / "plots"
    code = cli.main(["simulate", "--scenario", "ha-reservation", "--plot", str(out)])
    captured = capsys.readouterr()
    assert code == 3
    assert "matplotlib" in captured.err
    assert "pip install 'vmsched[plots]'" in captured.err
    assert "Traceback" not in captured.err
    assert not out.exists()
