"""What a worker of a catalogue route (place, filter, weigh) does about policy units it may lack.

It consumes the route's plain queue and the queue of its own unit catalogue (constants.
CATALOGUE_ROUTES; vmsched.lifecycle.routes says how the selector picks one), and a request naming a
unit it lacks, which the selector's routing should have kept away (a worker that started without a
plugin in the second before the selector read the catalogues again), is answered UnitsUnavailable
naming this instance and the units, and logged: never the bare unknown_policy_unit of a unit no
instance knows, which would say nothing of where.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TypeVar

from vmsched import constants as c
from vmsched.contracts import Message
from vmsched.errors import UnitsUnavailable
from vmsched.logging import get_logger
from vmsched.runtime import Runtime
from vmsched.scheduling.units import REGISTRY
from vmsched.scheduling.units.base import PolicyUnit
from vmsched.store.catalogues import catalogue_hash, units_of

log = get_logger("vmsched.worker")

Req = TypeVar("Req", bound=Message)


def check_units(
    service: str, instance: str, names: Collection[str], registry: Mapping[str, PolicyUnit] = REGISTRY
) -> None:
    """UnitsUnavailable (logged) naming this instance if `registry` lacks any of the units `names`."""
    missing = sorted({n for n in names if n not in registry})
    if not missing:
        return
    catalogue = catalogue_hash(units_of(registry))
    log.warning("a request names units this instance lacks", service=service, instance=instance, units=missing)
    raise UnitsUnavailable(
        f"{service} {instance} (catalogue {catalogue}) lacks {', '.join(missing)}: it was sent a request "
        f"it cannot run (it may have started without the plugin a moment ago); send it again, and install "
        f"the plugin there (`vmsched units list` shows each instance's units)",
        location="policy",
    )


async def serve_routed(
    rt: Runtime,
    route: str,
    request_type: type[Req],
    handler: Callable[[Req], Awaitable[Message]],
    units: Callable[[Req], Collection[str]],
) -> None:
    """Serve `route` and this process's catalogue route of it with `handler`, after checking the
    request's `units` are here. The plain route last: its consumer may be a readiness signal
    (vmsched_services.tools.procs.READY_ROUTE)."""
    service = c.CATALOGUE_ROUTES[route]

    async def checked(req: Req) -> Message:
        check_units(service, rt.instance, units(req))
        return await handler(req)

    catalogue = catalogue_hash(units_of(REGISTRY.load(rt.settings)))
    await rt.bus.serve(c.catalogue_route(route, catalogue), request_type, checked)
    await rt.bus.serve(route, request_type, checked)


__all__ = ["check_units", "serve_routed"]
