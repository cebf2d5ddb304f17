"""Simulations decide exactly as recorded: every placement and migration target, its alternates, its
explanation, and (every seventh request, asked again with `explain_hosts` and `explain_scores`)
every removed host with its reason and the whole score table.

The recording (tests/unit/data/simulation_decisions.json) was made by `record` below from the code
before placement was made fast at 10,000 hosts (incremental tables, partial ordering, vectorized
units), so this test says the fast paths decide as the straightforward ones did, on workloads that
take every path: roomy and crowded clusters, full hosts, affinity groups, balancing migrations. A
deliberate change of what a policy decides changes the recording: regenerate it with
`.venv/bin/python -m tests.unit.test_simulation_decisions` and say why in the commit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from vmsched.contracts import ScheduleRequest
from vmsched.scheduling.hosts import HostTable
from vmsched.scheduling.placement import Outcome, Placed, Unplaceable
from vmsched.scheduling.policy import BUILTIN_POLICIES
from vmsched.simulation.engine import Simulation, decide
from vmsched.simulation.generator import GeneratorSpec, generate

RECORDING = Path(__file__).parent / "data" / "simulation_decisions.json"
POLICIES = ("none", "power_saving", "evenly_distributed")
#: A roomy cluster (every host fits, the weights decide) and a crowded one (full hosts removed by
#: the Memory filter, unplaceable VMs, overloaded hosts, migrations).
WORKLOADS = {
    "roomy": GeneratorSpec(hosts=40, vms=300, hours=4, seed=5),
    "crowded": GeneratorSpec(hosts=8, vms=500, hours=6, seed=6, long_lived_share=0.5),
}
#: Every DEEP-th request is also decided with every removed host and the whole score table.
DEEP = 7


def _outcome(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, Placed):
        return {
            "placements": [p.model_dump(mode="json") for p in outcome.placements],
            "explanation": outcome.explanation.model_dump(mode="json"),
        }
    if isinstance(outcome, Unplaceable):
        return {"unplaceable": outcome.explanation.model_dump(mode="json")}
    return {"wait": True}


class Recording(Simulation):
    """Decides as the engine does and keeps every decision."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.log: list[dict[str, Any]] = []

    async def decide(self, table: HostTable, request: ScheduleRequest, now: float) -> Outcome:
        outcome = await super().decide(table, request, now)
        entry = {"vm": request.vm.vm_id, "kind": str(request.kind), **_outcome(outcome)}
        if len(self.log) % DEEP == 0:
            deep = request.model_copy(update={"explain_hosts": True, "explain_scores": True})
            entry["deep"] = _outcome(await decide(table, self.policy, deep, now))
        self.log.append(entry)
        return outcome


def record(policy: str, workload: str) -> dict[str, Any]:
    """The decisions of one simulation: each request's VM and target ("-": not placed), and a
    digest of everything else decided."""
    sim = Recording(generate(WORKLOADS[workload]), BUILTIN_POLICIES[policy])
    asyncio.run(sim.run())
    targets = [f"{e['vm']} {e['placements'][0]['host_id'] if 'placements' in e else '-'}" for e in sim.log]
    text = json.dumps(sim.log, sort_keys=True, separators=(",", ":"))
    return {"targets": targets, "digest": hashlib.sha256(text.encode()).hexdigest()}


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("policy", POLICIES)
def test_simulations_decide_as_recorded(policy: str, workload: str) -> None:
    expected = json.loads(RECORDING.read_text(encoding="utf-8"))[f"{policy}/{workload}"]
    got = record(policy, workload)
    assert got["targets"] == expected["targets"]  # the readable part first
    assert got["digest"] == expected["digest"]


def test_the_recording_takes_the_paths_it_guards() -> None:
    recorded = json.loads(RECORDING.read_text(encoding="utf-8"))
    crowded = [t.split()[1] for p in POLICIES for t in recorded[f"{p}/crowded"]["targets"]]
    assert "-" in crowded  # unplaceable VMs
    arrivals = len(generate(WORKLOADS["crowded"]).arrivals)
    for policy in ("power_saving", "evenly_distributed"):
        # More decisions than arrivals: balancing migrations were decided too.
        assert len(recorded[f"{policy}/crowded"]["targets"]) > arrivals


if __name__ == "__main__":
    RECORDING.parent.mkdir(exist_ok=True)
    data = {f"{p}/{w}": record(p, w) for p in POLICIES for w in sorted(WORKLOADS)}
    RECORDING.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    sys.exit(0)
