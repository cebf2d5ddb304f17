"""x-vmsched-roles: the RabbitMQ users `vmsched security` defines and what each may do, for the
default (empty) VMSCHED_AMQP_PREFIX, from the same grants the definitions are made of."""

from __future__ import annotations

from typing import Any

from vmsched.settings import Settings
from vmsched_services.tools.security.rabbit_defs import grants
from vmsched_services.tools.security.roles import ADMIN, API, ENGINE, user_name

#: What each role is for, in a line.
PURPOSE = {
    ENGINE: "the engine: publishes state reports and schedule requests, reads decisions and alerts",
    ADMIN: "people administering: policies, removals, requeueing dead letters, reading the dead letters",
    API: "the HTTP API: calls the engine's and the administrators' routes for its users, streams them events",
}


def roles() -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": "Permissions are regular expressions on exchange and queue names (configure, write, "
        "read) and, per topic exchange, on routing keys (write: publishing; read: binding). Every role "
        "runs with VMSCHED_AMQP_DECLARE=false. A service's own queues are vmsched.own.<role>.<hex>.",
    }
    for role, grant in grants(Settings.model_construct()).items():
        out[role] = {
            "user": user_name(role),
            "purpose": PURPOSE.get(role, f"the {role} service"),
            "configure": grant.configure,
            "write": grant.write,
            "read": grant.read,
            "topics": {exchange: {"write": w, "read": r} for exchange, (w, r) in grant.topics.items()},
        }
    return out
