"""Simulations: vmsched's simulator (vmsched.simulation, as `vmsched simulate --generate` runs it) on
a small generated workload, two stored policies side by side.

Each run is a process of its own (simulation_worker), killed past VMSCHED_API_SIMULATION_TIMEOUT_S;
at most VMSCHED_API_SIMULATION_CONCURRENCY run at once (the others wait their turn within the same
timeout). Sizes are bounded by VMSCHED_API_SIMULATION_MAX_HOSTS and _MAX_HOURS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Annotated

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from vmsched.contracts.policies import PolicyName
from vmsched.errors import InvalidRequest, ServerUnavailable
from vmsched.logging import get_logger
from vmsched.simulation.report import PolicyReport
from vmsched.simulation.targets import Verdict
from vmsched_services.api.deps import ClientsDep, Operator, api_state

log = get_logger("vmsched.api")
router = APIRouter(tags=["simulations"])
#: VMs one simulation may generate, whatever the hosts.
MAX_VMS = 5000
_slots: dict[int, asyncio.Semaphore] = {}


class SimulationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: int = Field(
        20, ge=1, description="Hosts of the generated cluster (at most VMSCHED_API_SIMULATION_MAX_HOSTS)."
    )
    vms: int = Field(200, ge=1, le=MAX_VMS, description="VM arrivals over the run.")
    hours: float = Field(4.0, gt=0, description="Simulated hours (at most VMSCHED_API_SIMULATION_MAX_HOURS).")
    seed: int = Field(1, ge=0, le=2**31 - 1, description="The generator's seed: the same seed, the same workload.")
    ha_reservation: bool = Field(False, description="The cluster keeps HA reservation.")
    policies: Annotated[list[PolicyName], Field(min_length=1, max_length=2)] = Field(
        description="One or two stored policies' names, simulated side by side on the same workload."
    )


class SimulationOut(BaseModel):
    workload: str
    hosts: int
    arrivals: int
    hours: float
    policies: list[PolicyReport] = Field(description="One report per policy, with its samples (time series).")
    targets: list[Verdict] = Field(description="The quality targets each policy meets or misses.")


def _slot(limit: int) -> asyncio.Semaphore:
    return _slots.setdefault(limit, asyncio.Semaphore(limit))


async def _run(request: dict[str, object], timeout_s: float) -> dict[str, object]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "vmsched_services.api.simulation_worker",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await proc.communicate(json.dumps(request).encode())
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        log.error("simulation failed", returncode=proc.returncode, stderr=err.decode("utf-8", "replace")[-4000:])
        raise RuntimeError(f"the simulation process exited with {proc.returncode}")
    result: dict[str, object] = json.loads(out)
    return result


@router.post("/simulations", response_model=SimulationOut, summary="Simulate a generated workload (operator)")
async def simulations(request: Request, body: SimulationIn, _: Operator, cl: ClientsDep) -> SimulationOut:
    settings = api_state(request).settings
    if body.hosts > settings.api_simulation_max_hosts:
        raise InvalidRequest(
            f"{body.hosts} hosts; this api simulates at most {settings.api_simulation_max_hosts} "
            "(VMSCHED_API_SIMULATION_MAX_HOSTS); `vmsched simulate` runs bigger ones",
            location="body.hosts",
        )
    if body.hours > settings.api_simulation_max_hours:
        raise InvalidRequest(
            f"{body.hours:g} hours; this api simulates at most {settings.api_simulation_max_hours:g} "
            "(VMSCHED_API_SIMULATION_MAX_HOURS)",
            location="body.hours",
        )
    if len(set(body.policies)) != len(body.policies):
        raise InvalidRequest("the same policy twice: name two different ones", location="body.policies")
    stored = (await cl.policies.read(list(body.policies))).policies
    documents = {p.document.name: p.document.model_dump(mode="json") for p in stored}
    job = {
        "workload": {
            "hosts": body.hosts,
            "vms": body.vms,
            "hours": body.hours,
            "seed": body.seed,
            "ha_reservation": body.ha_reservation,
        },
        "policies": [documents[name] for name in body.policies],
    }
    timeout_s = settings.api_simulation_timeout_s
    try:
        async with asyncio.timeout(timeout_s), _slot(settings.api_simulation_concurrency):
            result = await _run(job, timeout_s)
    except TimeoutError:
        raise ServerUnavailable(
            f"the simulation did not finish within {timeout_s:g} s (VMSCHED_API_SIMULATION_TIMEOUT_S)",
            hint="simulate fewer hosts, VMs or hours, or run `vmsched simulate` for big runs",
        ) from None
    return SimulationOut.model_validate(result)


__all__ = ["SimulationIn", "SimulationOut", "router"]
