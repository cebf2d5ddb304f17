"""Where a policy's worker calls go: never to a worker that lacks one of the policy's units.

Units come from plugins, and a worker may run where a plugin is not installed. Every worker of a
catalogue route (constants.CATALOGUE_ROUTES: place, filter, weigh) consumes the plain queue and the
queue of its own catalogue ("place.<hash>", the hash of its units and their origins), which it
shares with the workers whose units are the same. Every instance announces its units in Redis
(vmsched.store.catalogues). So, for a call under a policy:

* every live worker of the service has every unit of the policy (the usual case, and always so
  without plugins), or none announced itself: the plain route, as before;
* some do, some do not: the route of the catalogue the most of those that do share;
* none does: UnitsUnavailable, naming the missing units and the instances lacking them.

The live catalogues are read from Redis at most once per `max_age_s`; a worker that started within
that time without a plugin may still get a plain call it cannot run: it answers UnitsUnavailable
naming itself (vmsched_services.worker_units), and the caller reads the catalogues again and sends
the call once more (Placing).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Collection, Sequence

from vmsched import constants as c
from vmsched.errors import UnitsUnavailable
from vmsched.logging import get_logger
from vmsched.store.catalogues import Announcement, UnitCatalogues

log = get_logger("vmsched.selector")

#: How long the live catalogues read from Redis are used before they are read again.
MAX_AGE_S = 1.0
#: The instances one UnitsUnavailable message names (the rest are counted).
NAMED_MAX = 10
#: The least time between two log lines about the same policy's missing units.
LOG_EVERY_S = 10.0


def lacking(units: Collection[str], instances: Sequence[Announcement]) -> list[tuple[Announcement, list[str]]]:
    """Each instance of `instances` without every one of `units`, with the ones it lacks."""
    found = [(a, sorted(u for u in set(units) if u not in a.units)) for a in instances]
    return [(a, missing) for a, missing in found if missing]


def choose_route(
    route: str,
    units: Collection[str],
    instances: Sequence[Announcement],
    *,
    policy: str = "",
    gone: Collection[str] = (),
) -> str:
    """The route a `route` call under a policy using `units` goes to, given the live `instances`
    (of every service; those of the route's service count) but those of the catalogues `gone`
    (found with no worker consuming, whatever their announcements still say). See the module
    docstring."""
    service = c.CATALOGUE_ROUTES[route]
    workers = [a for a in instances if a.service == service and a.catalogue not in gone]
    without = lacking(units, workers)
    if not without:
        return route
    having = Counter(a.catalogue for a in workers if not lacking(units, [a]))
    if not having:
        raise UnitsUnavailable(unavailable_message(service, without, policy), location="policy")
    # The most workers to share the load; among as many, the first hash, so every selector agrees.
    best = min(having, key=lambda h: (-having[h], h))
    return c.catalogue_route(route, best)


def unavailable_message(service: str, without: Sequence[tuple[Announcement, list[str]]], policy: str = "") -> str:
    """What UnitsUnavailable says when no running `service` has every unit: which it lacks, where."""
    missing = sorted({u for _, units in without for u in units})
    named = "; ".join(
        f"{a.service} {a.instance} (catalogue {a.catalogue}) lacks {', '.join(units)}"
        for a, units in without[:NAMED_MAX]
    )
    more = f"; and {len(without) - NAMED_MAX} more instance(s)" if len(without) > NAMED_MAX else ""
    of = f" of policy {policy}" if policy else ""
    return (
        f"no running {service} has every unit{of} (missing: {', '.join(missing)}): {named}{more}; install the "
        f"plugin providing them where a {service} runs, or start one that has it (`vmsched units list` shows "
        f"each instance's units)"
    )


class UnitRoutes:
    """choose_route over the live catalogues in Redis, read at most once per `max_age_s`."""

    def __init__(self, catalogues: UnitCatalogues, *, max_age_s: float = MAX_AGE_S) -> None:
        self.catalogues = catalogues
        self.max_age_s = max_age_s
        self._instances: list[Announcement] = []
        self._read_at = float("-inf")
        self._reading = asyncio.Lock()
        self._logged: dict[str, float] = {}

    def forget(self) -> None:
        """Read the catalogues again on the next call (a worker said it lacks units: they changed)."""
        self._read_at = float("-inf")

    async def route(self, route: str, units: Collection[str], *, policy: str = "", gone: Collection[str] = ()) -> str:
        """The route for a `route` call under `policy`, which uses `units`; UnitsUnavailable (logged)
        when no live worker of the route's service (but those of the catalogues `gone`) has every one."""
        instances = await self._live()
        try:
            return choose_route(route, units, instances, policy=policy, gone=gone)
        except UnitsUnavailable as exc:
            now = time.monotonic()
            if now - self._logged.get(policy, float("-inf")) >= LOG_EVERY_S:
                self._logged[policy] = now
                log.warning("no worker has every unit of the policy", policy=policy, route=route, error=str(exc))
            raise

    async def _live(self) -> list[Announcement]:
        if time.monotonic() - self._read_at < self.max_age_s:
            return self._instances
        async with self._reading:
            if time.monotonic() - self._read_at >= self.max_age_s:
                try:
                    self._instances = await self.catalogues.instances()
                except Exception as exc:
                    # Redis away: the selector cannot take a cluster's lock either; the catalogues
                    # last read (or the plain routes) serve until it is back.
                    log.warning("unit catalogues not read", error=f"{type(exc).__name__}: {exc}")
                self._read_at = time.monotonic()
        return self._instances


__all__ = ["UnitRoutes", "choose_route", "lacking", "unavailable_message"]
