"""Built-in workloads: the worked examples of the designs vmsched follows, replayable by name
(`vmsched simulate --scenario NAME`).

A scenario file is a workload with two keys of its own: `run`, the policies it is meant for (built-in
names or the workload's own `policies:`), simulated when no `--policy` is given; and `expect`, per
policy the report figures it should come to (`field: value` for exactly that, or `field: "<= n"`,
`">= n"`), printed against what the run measured.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from vmsched import bounded_text
from vmsched.simulation.report import PolicyReport
from vmsched.simulation.workload import Workload, parse_workload

#: name -> what it shows.
SCENARIOS: dict[str, str] = {
    "even-vm-count": "oVirt's even-VM-count example: 5 hosts with 12, 10, 8, 9, 6 VMs",
    "ha-reservation": "oVirt's HA reservation check: 8 HA VMs two per host, the check fails, then a host fails",
    "ha-reservation-balance": "oVirt's HA reservation balancing: no move until a host has 5 HA VMs (optimal 2, 200%)",
}
_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge, "==": operator.eq}


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: Workload
    #: The policies to simulate without --policy.
    run: tuple[str, ...] = ()
    #: policy -> report field -> expected (a number, or "<= n", ">= n", "== n").
    expect: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Expectation:
    policy: str
    figure: str
    expected: str
    actual: str
    met: bool

    def line(self) -> str:
        verdict = "as expected" if self.met else "NOT as expected"
        return f"{self.policy}: {self.figure}: expected {self.expected}, got {self.actual}: {verdict}"

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def scenario(name: str) -> Scenario:
    """The built-in scenario `name` (KeyError when there is none)."""
    if name not in SCENARIOS:
        raise KeyError(name)
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    raw = bounded_text.load(text, f"scenario {name}")
    run = tuple(raw.pop("run", ()) or ())
    expect = dict(raw.pop("expect", {}) or {})
    workload = parse_workload(json.dumps(raw), f"scenario {name}")
    return Scenario(name, workload, run, expect)


def load_scenario(name: str) -> Workload:
    """The built-in scenario `name`'s workload (KeyError when there is none)."""
    return scenario(name).workload


def _judge(expected: Any, actual: Any) -> bool:
    if isinstance(expected, str):
        op, _, number = expected.strip().partition(" ")
        if op in _OPS and isinstance(actual, int | float):
            return _OPS[op](float(actual), float(number))
        return str(actual) == expected
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        return abs(float(actual) - float(expected)) <= 1e-9 + 1e-6 * abs(float(expected))
    return bool(actual == expected)


def expectations(s: Scenario, reports: Sequence[PolicyReport]) -> list[Expectation]:
    """Each expected figure of the policies simulated, against what their run measured; a policy the
    scenario expects and that was not simulated is left out."""
    out: list[Expectation] = []
    for report in reports:
        data = report.as_json(with_samples=False)
        for figure, expected in s.expect.get(report.policy, {}).items():
            actual = data.get(figure, "(no such figure)")
            out.append(Expectation(report.policy, figure, str(expected), str(actual), _judge(expected, actual)))
    return out


def render_expectations(found: Sequence[Expectation]) -> str:
    if not found:
        return ""
    met = sum(e.met for e in found)
    return "\n".join(
        [f"expected against actual ({met} of {len(found)} as expected):", *(f"  {e.line()}" for e in found)]
    )


__all__ = [
    "SCENARIOS",
    "Expectation",
    "Scenario",
    "expectations",
    "load_scenario",
    "render_expectations",
    "scenario",
]
