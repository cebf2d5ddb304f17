"""The roles vmsched's parts run as: one per service kind, the engine, and administrators.

Each role is one user on each server it needs (RabbitMQ, Redis, PostgreSQL), named
`vmsched-<role>` (RabbitMQ, Redis) or `vmsched_<role>` (PostgreSQL, whose unquoted names take no
dashes), so a log line or a refusal names the part that did it.
"""

from __future__ import annotations

from typing import Final

#: The service kinds, as `vmsched service NAME` knows them.
SERVICE_ROLES: Final = (
    "selector",
    "filter-worker",
    "weigher",
    "balancer",
    "ha-monitor",
    "state-tracker",
    "policy-admin",
)
#: The engine (publishes state and schedule requests, reads decisions) and people administering.
ENGINE: Final = "engine"
ADMIN: Final = "admin"
#: The HTTP API service: no state of its own, no Redis or PostgreSQL user; it calls the engine's and
#: the administrators' routes for its users and follows the events it streams to them.
API: Final = "api"
ROLES: Final = (*SERVICE_ROLES, ENGINE, ADMIN, API)


def user_name(role: str) -> str:
    """The RabbitMQ and Redis user of `role`."""
    return f"vmsched-{role}"


def pg_role_name(role: str) -> str:
    """The PostgreSQL role of `role`."""
    return f"vmsched_{role.replace('-', '_')}"
