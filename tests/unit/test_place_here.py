"""Which groups the selector places itself under VMSCHED_PLACE_IN_SELECTOR (lifecycle.placing.runs_here)."""

from __future__ import annotations

import time
import uuid

from tests import factories
from vmsched.contracts import PlaceItem, PlaceRequest, ScheduleRequest
from vmsched.lifecycle.placing import LOCAL_PLACE_MAX_WORK, runs_here
from vmsched.scheduling.policy import DEFAULT_POLICY


def _request(vms: int) -> PlaceRequest:
    first, *batch = [factories.vm(vm_id=f"vm{i}") for i in range(vms)]
    req = ScheduleRequest(request_id=uuid.uuid4(), cluster_id="c", vm=first, batch=batch)
    return PlaceRequest(
        request_id=uuid.uuid4(),
        cluster_id="c",
        state_version=1,
        items=[PlaceItem(request=req, may_wait=False)],
        filters=DEFAULT_POLICY.filter_calls(),
        weights=DEFAULT_POLICY.weight_calls(),
        selector=DEFAULT_POLICY.selector,
        pending=[],
        now=time.time(),
        pending_ttl_s=60,
        fencing_token=1,
    )


UNITS = [f.unit for f in DEFAULT_POLICY.filters] + [w.unit for w in DEFAULT_POLICY.weights]


def test_a_small_group_of_installed_units_is_placed_here() -> None:
    assert runs_here(factories.hosts_n(100), _request(3), UNITS)


def test_a_group_past_the_work_bound_goes_to_a_worker() -> None:
    hosts = factories.hosts_n(1000)
    fits = LOCAL_PLACE_MAX_WORK // 1000
    assert runs_here(hosts, _request(fits), UNITS)
    assert not runs_here(hosts, _request(fits + 1), UNITS)


def test_a_unit_not_installed_here_goes_to_a_worker() -> None:
    assert not runs_here(factories.hosts_n(10), _request(1), [*UNITS, "OnlyOnSomeWorkers"])
