"""vmsched services: one sub-package per service, each a thin shell over the vmsched library.

`SERVICES` maps the name used by `vmsched run NAME` (and deploy/compose.yml) to the coroutine that
starts that service's consumers on a Runtime. Order is start order for `vmsched up`. Each service's
module is imported when it is started, not when this package is: `vmsched --help` and the light
commands load no service, NumPy or server driver.

`BUS_ONLY` names the services that need nothing but the bus (the api): run on their own they get a
vmsched.runtime.BusRuntime, which never connects to Redis or PostgreSQL.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from vmsched.runtime import BusRuntime

ServiceStart = Callable[["BusRuntime"], Awaitable[object]]


@dataclass(frozen=True)
class _Starter:
    """`start(rt)` of the service package `package`, imported on the first call."""

    package: str

    async def __call__(self, rt: BusRuntime) -> object:
        module = importlib.import_module(f"vmsched_services.{self.package}.service")
        return await cast(ServiceStart, module.start)(rt)


SERVICES: Mapping[str, ServiceStart] = MappingProxyType(
    {
        "state-tracker": _Starter("state_tracker"),
        "filter-worker": _Starter("filter_worker"),
        "weigher": _Starter("weigher"),
        "selector": _Starter("selector"),
        "ha-monitor": _Starter("ha_monitor"),
        "balancer": _Starter("balancer"),
        "policy-admin": _Starter("policy_admin"),
        "api": _Starter("api"),
    }
)

#: Services that use the bus alone (see the module docstring).
BUS_ONLY = frozenset({"api"})

__all__ = ["BUS_ONLY", "SERVICES", "ServiceStart"]
