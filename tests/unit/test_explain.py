"""`vmsched explain`'s table: hosts as columns, one row per filter and weight unit, then totals."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from tests.factories import schedule_decision
from vmsched.contracts import (
    Explanation,
    FilteredHost,
    HaAlert,
    HaRecovered,
    MigrationDecision,
    PowerAction,
    ScheduleDecision,
    ScoreTable,
    UnitScores,
)
from vmsched.explain import render_event, render_table


def _decision() -> ScheduleDecision:
    return schedule_decision(
        "c1",
        host_id="h2",
        vm_id="vm1",
        alternates=["h1"],
        policy="none",
        elapsed_ms=0.0,
        explanation=Explanation(
            summary="2/4 hosts available: 1 Memory (free memory 10 MB < required 1088 MB), 1 Network (...)",
            candidates=4,
            filters=["Memory", "Network"],
            filtered=[
                FilteredHost(host_id="h3", filter="Memory", reason="free memory 10 MB < required 1088 MB"),
                FilteredHost(host_id="h4", filter="Network", reason="missing network 'storage'"),
            ],
            scores=ScoreTable(
                selector="RankSelector",
                hosts=["h2", "h1"],
                units=[UnitScores(unit="OptimalForEvenCpuDistribution", factor=2, raw=[10, 50], points=[1, 0])],
                totals=[2, 0],
            ),
        ),
    )


def test_hosts_are_columns_best_first_then_removed_in_order() -> None:
    text = render_table(_decision())
    header = next(line for line in text.splitlines() if "factor" in line)
    assert header.split()[1:] == ["h2", "h1", "h3", "h4"]


def test_each_filter_row_says_kept_removed_or_already_gone() -> None:
    lines = render_table(_decision()).splitlines()
    memory = next(line for line in lines if line.strip().startswith("Memory"))
    network = next(line for line in lines if line.strip().startswith("Network"))
    assert memory.split()[1:] == ["kept", "kept", "removed", "[1]", "kept"]
    assert network.split()[1:] == ["kept", "kept", "·", "removed", "[2]"]
    assert "[1] h3: Memory: free memory 10 MB < required 1088 MB" in lines
    assert "[2] h4: Network: missing network 'storage'" in lines


def test_weight_rows_show_raw_points_and_factor_and_totals() -> None:
    lines = render_table(_decision()).splitlines()
    row = next(line for line in lines if line.strip().startswith("OptimalForEvenCpuDistribution"))
    assert row.split()[1:] == ["2", "10", "/", "1", "50", "/", "0"]
    total = next(line for line in lines if line.strip().startswith("total"))
    assert total.split()[1:] == ["2", "0"]


def test_a_decision_without_scores_says_how_to_get_them() -> None:
    d = _decision()
    bare = d.model_copy(update={"explanation": d.explanation.model_copy(update={"scores": None})})
    text = render_table(bare)
    assert "weights (" not in text
    assert "--scores" in text
    assert "--scores" not in render_table(d)


def test_columns_are_capped_and_say_so() -> None:
    text = render_table(_decision(), max_hosts=2)
    assert "(2 more hosts not shown; --hosts 0 shows all)" in text


def test_watch_lines_name_what_happened() -> None:
    now = datetime.now(UTC)
    migration = MigrationDecision(
        decision_id=uuid.uuid4(),
        cluster_id="c1",
        vm_id="vm7",
        source_host="h1",
        target_host="h2",
        balance_unit="OptimalForEvenCpuDistribution",
        reason="host h1 CPU 93% >= HighUtilization 80% for 4.0 min",
        policy="evenly_distributed",
        request_id=uuid.uuid4(),
        decided_at=now,
    )
    assert "migration  c1 vm7 h1 -> h2  [OptimalForEvenCpuDistribution] host h1 CPU 93%" in render_event(migration)
    power = PowerAction(
        action_id=uuid.uuid4(),
        cluster_id="c1",
        host_id="h9",
        action="power_off",
        balance_unit="OptimalForCpuPowerSaving",
        reason="3 empty hosts > HostsInReserve 1",
        policy="power_saving",
        decided_at=now,
    )
    assert "power      c1 power_off h9  3 empty hosts" in render_event(power)
    alert = HaAlert(alert_id=uuid.uuid4(), cluster_id="c1", failing_hosts=["h1"], message="m", checked_at=now)
    assert "HA ALERT   c1 h1: m" in render_event(alert)
    ok = HaRecovered(cluster_id="c1", previously_failing=["h1"], message="fine", checked_at=now)
    assert "HA ok      c1: fine" in render_event(ok)
    assert "decision   c1 vm1 -> h2" in render_event(_decision())
