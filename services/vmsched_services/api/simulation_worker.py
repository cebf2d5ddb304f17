"""A simulation for the api, in a process of its own (`python -m vmsched_services.api.simulation_worker`):
the request as JSON on standard input, the reports as JSON on standard output.

A process, not a thread: the api kills it when it runs past VMSCHED_API_SIMULATION_TIMEOUT_S (a
thread cannot be stopped), and its CPU-bound work does not hold the api's event loop or GIL.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

from vmsched.contracts import PolicyDocument
from vmsched.scheduling.policy_docs import policy_of
from vmsched.simulation.generator import GeneratorSpec, generate
from vmsched.simulation.targets import verdicts
from vmsched_services.tools.simulate import run_all


def simulate(request: dict[str, Any]) -> dict[str, Any]:
    """{"workload": GeneratorSpec fields, "policies": [PolicyDocument JSON]} -> the reports."""
    workload = generate(GeneratorSpec(**request["workload"]))
    policies = [
        policy_of(PolicyDocument.model_validate(doc), uuid.uuid5(uuid.NAMESPACE_URL, f"api:{n}"))
        for n, doc in enumerate(request["policies"])
    ]
    reports = [report for report, _ in asyncio.run(run_all(workload, policies))]
    return {
        "workload": workload.name,
        "hosts": len(workload.host_ids()),
        "arrivals": len(workload.arrivals),
        "hours": workload.end_s() / 3600,
        "policies": [r.as_json() for r in reports],
        "targets": [v.as_json() for v in verdicts(reports)],
    }


def main() -> None:
    json.dump(simulate(json.loads(sys.stdin.read())), sys.stdout)


if __name__ == "__main__":
    main()
