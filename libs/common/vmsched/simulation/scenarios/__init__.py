"""Built-in workloads: the worked examples of the designs vmsched follows, replayable by name
(`vmsched simulate --scenario NAME`)."""

from __future__ import annotations

from importlib import resources

from vmsched.simulation.workload import Workload, parse_workload

#: name -> what it shows.
SCENARIOS: dict[str, str] = {
    "even-vm-count": "oVirt's even-VM-count example: 5 hosts with 12, 10, 8, 9, 6 VMs",
    "ha-reservation": "oVirt's HA reservation check: 8 HA VMs two per host, the check fails, then a host fails",
    "ha-reservation-balance": "oVirt's HA reservation balancing: no move until a host has 5 HA VMs (optimal 2, 200%)",
}


def load_scenario(name: str) -> Workload:
    """The built-in scenario `name` (KeyError when there is none)."""
    if name not in SCENARIOS:
        raise KeyError(name)
    text = resources.files(__name__).joinpath(f"{name}.yaml").read_text(encoding="utf-8")
    return parse_workload(text, f"scenario {name}")


__all__ = ["SCENARIOS", "load_scenario"]
