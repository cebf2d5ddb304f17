"""vmsched services: one sub-package per service, each a thin shell over the vmsched library.

`SERVICES` maps the name used by `vmsched run NAME` (and deploy/compose.yml) to the coroutine that
starts that service's consumers on a Runtime. Order is start order for `vmsched up`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

from vmsched.runtime import Runtime
from vmsched_services.balancer.service import start as _balancer
from vmsched_services.filter_worker.service import start as _filter_worker
from vmsched_services.ha_monitor.service import start as _ha_monitor
from vmsched_services.policy_admin.service import start as _policy_admin
from vmsched_services.selector.service import start as _selector
from vmsched_services.state_tracker.service import start as _state_tracker
from vmsched_services.weigher.service import start as _weigher

ServiceStart = Callable[[Runtime], Awaitable[object]]

SERVICES: Mapping[str, ServiceStart] = MappingProxyType(
    {
        "state-tracker": _state_tracker,
        "filter-worker": _filter_worker,
        "weigher": _weigher,
        "selector": _selector,
        "ha-monitor": _ha_monitor,
        "balancer": _balancer,
        "policy-admin": _policy_admin,
    }
)

__all__ = ["SERVICES", "ServiceStart"]
