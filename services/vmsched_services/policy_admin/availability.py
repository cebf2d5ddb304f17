"""Whether the running services can run a policy's units, from the catalogues they announce.

Workers of a catalogue route (filter-workers and weighers: constants.CATALOGUE_ROUTES) get a policy's
calls only if they have every unit of it (vmsched.lifecycle.routes), so a policy is refused only when
no running instance of such a service has every unit it would run there; when only some lack one it
is stored, with a warning naming those. Other services (the balancer) run a cluster's policy on
whichever instance leases the cluster: every live instance must have the unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vmsched import constants as c
from vmsched.contracts import PolicyDocument, RunningInstance
from vmsched.lifecycle.routes import lacking, unavailable_message
from vmsched.scheduling.policy_docs import SERVICES_BY_USE
from vmsched.scheduling.units.base import BUILTIN_ORIGIN, PolicyUnit
from vmsched.store.catalogues import Announcement

#: The services whose calls go only to instances having the policy's units.
ROUTED = frozenset(c.CATALOGUE_ROUTES.values())
#: Instances named in one warning (the rest are counted).
NAMED_MAX = 10


def strict_available(instances: Sequence[Announcement]) -> dict[str, frozenset[str]]:
    """Per service not routed by catalogue, the units every live instance of it has."""
    by_service: dict[str, frozenset[str]] = {}
    for a in instances:
        if a.service in ROUTED:
            continue
        names = frozenset(a.units)
        by_service[a.service] = by_service[a.service] & names if a.service in by_service else names
    return by_service


def routed_check(
    doc: PolicyDocument, registry: Mapping[str, PolicyUnit], instances: Sequence[Announcement]
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of `doc` on the running routed services: no instance of one has every
    unit it would run (a problem), or some instances lack one (a warning naming them)."""
    problems: list[str] = []
    warnings: list[str] = []
    for service in sorted(ROUTED):
        units: list[str] = []
        if service in SERVICES_BY_USE["filter"]:
            units += [f.unit for f in doc.filters]
        if service in SERVICES_BY_USE["weight"]:
            units += [w.unit for w in doc.weights]
        units = [u for u in units if u in registry]  # an unknown unit is a problem of its own
        workers = [a for a in instances if a.service == service]
        without = lacking(units, workers)
        if not without:
            continue
        if len(without) == len(workers):
            problems.append(unavailable_message(service, without))
            continue
        named = "; ".join(f"{a.instance} lacks {', '.join(missing)}" for a, missing in without[:NAMED_MAX])
        more = f"; and {len(without) - NAMED_MAX} more" if len(without) > NAMED_MAX else ""
        warnings.append(
            f"policy {doc.name}: {len(without)} of {len(workers)} running {service} instance(s) lack units it uses "
            f"({named}{more}); its calls go to the {len(workers) - len(without)} that have every one"
        )
    return problems, warnings


def running_instances(instances: Sequence[Announcement]) -> list[RunningInstance]:
    """Each live instance's catalogue, with the units others of its service have and it lacks."""
    by_service: dict[str, set[str]] = {}
    for a in instances:
        by_service.setdefault(a.service, set()).update(a.units)
    return [
        RunningInstance(
            service=a.service,
            instance=a.instance,
            catalogue=a.catalogue,
            units=len(a.units),
            plugins={name: origin for name, origin in sorted(a.units.items()) if origin != BUILTIN_ORIGIN},
            lacks=sorted(by_service[a.service] - set(a.units)),
        )
        for a in instances
    ]


__all__ = ["ROUTED", "routed_check", "running_instances", "strict_available"]
