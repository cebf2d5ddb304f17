"""RabbitMQ definitions (the JSON `rabbitmqctl import_definitions`, the management API and
`load_definitions` take): the topology, one user per role and what each may do.

Permissions are regular expressions on exchange and queue names (configure, write, read), and, on
the topic exchanges, on routing keys (topic permissions: write is checked on publish, read on
binding a queue). Calls go to three direct exchanges by audience (constants.RPC_ROUTE_EXCHANGES)
because write permission cannot tell two routes of one direct exchange apart.

Under these definitions every part runs with VMSCHED_AMQP_DECLARE=false: the topology is made
here, once, by an administrator, so no role needs configure permission on a shared exchange or
queue (configure includes deleting it). Services still declare their own exclusive, server-named
queues (vmsched.own.<role>.<hex>) for the events they follow; the engine declares nothing at all and reads
vmsched.engine.events.

What this cannot express, and docs/security.md says: a user with write on the default exchange
(amq.default) can publish into any queue by name, bypassing topic permissions. Services need it (RPC
replies go through it, and so do retry copies); the engine and administrators do not get it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from vmsched import constants as c
from vmsched.bus.amqp.connection import dead_letter_queue_arguments, work_queue_arguments
from vmsched.settings import Settings
from vmsched_services.tools.security.roles import ADMIN, API, ENGINE, ROLES, SERVICE_ROLES, user_name

#: RabbitMQ's default password hashing (rabbit_password_hashing_sha256).
HASHING = "rabbit_password_hashing_sha256"
#: Routing keys the engine may publish on the events exchange: its state reports and resync answers.
ENGINE_PUBLISHES = (
    c.HOST_REPORT_PREFIX,
    c.VM_REPORT_PREFIX,
    c.STATE_REPORTS_PREFIX,
    c.CLUSTER_REPORT_PREFIX,
    c.RESYNC_COMPLETE_PREFIX,
)
#: Routing keys of the events the HTTP API streams to its users (it binds its own queues to them).
API_FOLLOWS = (
    c.DECISION_PREFIX,
    c.MIGRATION_PREFIX,
    c.POWER_PREFIX,
    c.HA_ALERT_PREFIX,
    c.HA_RECOVERED_PREFIX,
    c.MAINTENANCE_PREFIX,
)
#: Routing keys each service kind publishes on the events exchange (every service may also ask for a
#: resync: whoever finds that Redis forgot a cluster does).
SERVICE_PUBLISHES: dict[str, tuple[str, ...]] = {
    "selector": (c.DECISION_PREFIX,),
    "balancer": (c.MIGRATION_PREFIX, c.POWER_PREFIX, c.MAINTENANCE_PREFIX),
    "ha-monitor": (c.HA_ALERT_PREFIX, c.HA_RECOVERED_PREFIX),
    "policy-admin": (c.HOST_REMOVED_PREFIX, c.CLUSTER_REMOVED_PREFIX),
}
#: The call exchanges each service kind publishes to, besides the events and dead-letter exchanges.
SERVICE_CALLS: dict[str, tuple[str, ...]] = {
    "selector": (c.INTERNAL_EXCHANGE,),
    "balancer": (c.RPC_EXCHANGE,),
    # Requeueing a dead letter publishes it again where it was first published.
    "policy-admin": c.RPC_EXCHANGES,
}


def password_hash(password: str, salt: bytes | None = None) -> str:
    """The password as RabbitMQ stores it: base64(salt + sha256(salt + password)), 4-byte salt."""
    salt = salt if salt is not None else os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode("utf-8")).digest()).decode("ascii")


def vhost_of(settings: Settings) -> str:
    """The virtual host of VMSCHED_AMQP_URL ("/" when the URL names none)."""
    path = urlsplit(settings.amqp_url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


@dataclass(frozen=True)
class Grant:
    """One user's rights: regexes on names, and on routing keys per topic exchange."""

    configure: str
    write: str
    read: str
    #: exchange name -> (write, read) routing-key regexes.
    topics: Mapping[str, tuple[str, str]]


class Names:
    """The deployment's exchange and queue names (with VMSCHED_AMQP_PREFIX) as exact regexes."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, raw: str) -> str:
        return self.prefix + raw

    def exact(self, names: Iterable[str], *, raw: Iterable[str] = ()) -> str:
        """`^(a|b)$` of the prefixed `names` and the `raw` (unprefixed) regex parts; `^$` (nothing) if none."""
        parts = [re.escape(self(n)) for n in names] + list(raw)
        return f"^({'|'.join(parts)})$" if parts else "^$"


def _keys(prefixes: Iterable[str]) -> str:
    """Routing keys `<prefix>.<cluster>` of the given prefixes; `^$` (none) if there are none."""
    alternatives = [re.escape(p) for p in prefixes]
    return f"^({'|'.join(alternatives)})\\.[^.]+$" if alternatives else "^$"


def grants(settings: Settings) -> dict[str, Grant]:
    """What each role may do (see the module docstring)."""
    n = Names(settings.amqp_prefix)
    out: dict[str, Grant] = {
        ENGINE: Grant(
            configure="^$",
            write=n.exact([c.RPC_EXCHANGE, c.EVENTS_EXCHANGE]),
            read=n.exact([c.ENGINE_EVENTS_QUEUE]),
            topics={n(c.EVENTS_EXCHANGE): (_keys(ENGINE_PUBLISHES), "^$")},
        ),
        ADMIN: Grant(
            configure="^$",
            write=n.exact([c.RPC_EXCHANGE, c.ADMIN_EXCHANGE]),
            # Reading the dead letters (`vmsched dead-letters list`); requeueing goes through policy-admin.
            read=n.exact([c.DEAD_LETTER_QUEUE]),
            topics={n(c.EVENTS_EXCHANGE): ("^$", "^$")},
        ),
    }
    # The HTTP API calls the engine's routes and the administrators' (policy-admin authorizes each
    # administrative call by the broker-vouched user), gets its replies by direct reply-to (no
    # default exchange), and makes its own queues, bound to the events it streams, publishing none.
    # Its queues dead-letter like every service's (declaring a queue with a dead-letter exchange
    # needs write on that exchange; an event it cannot take goes there under its queue's name).
    api_queues = re.escape(n(c.own_queue(API, ""))) + "[0-9a-f]+"
    out[API] = Grant(
        configure=f"^{api_queues}$",
        write=n.exact([c.RPC_EXCHANGE, c.ADMIN_EXCHANGE, c.DEAD_LETTER_EXCHANGE], raw=[api_queues]),
        read=n.exact([c.EVENTS_EXCHANGE], raw=[api_queues]),
        topics={n(c.EVENTS_EXCHANGE): ("^$", _keys(API_FOLLOWS)), n(c.DEAD_LETTER_EXCHANGE): (".*", "^$")},
    )
    for role in SERVICE_ROLES:
        own_queues = re.escape(n(c.own_queue(role, ""))) + "[0-9a-f]+"
        # The queues of its catalogue routes, which it declares and binds itself: their names
        # depend on the units it runs with (constants.CATALOGUE_ROUTES).
        catalogue_queues = [
            re.escape(n(c.RPC_QUEUES[route])) + f"\\.[0-9a-f]{{{c.CATALOGUE_HASH_LENGTH}}}"
            for route, server in c.CATALOGUE_ROUTES.items()
            if server == role
        ]
        binds = [c.INTERNAL_EXCHANGE] if catalogue_queues else []
        served = [q for route, q in c.RPC_QUEUES.items() if _server_of(route) == role]
        if role == "state-tracker":
            served.append(c.STATE_EVENTS_QUEUE)
        if role == "policy-admin":
            served.append(c.DEAD_LETTER_QUEUE)
        publishes = (*SERVICE_PUBLISHES.get(role, ()), c.RESYNC_REQUESTED_PREFIX)
        event_write = ".*" if role == "policy-admin" else _keys(publishes)
        out[role] = Grant(
            configure=n.exact([], raw=[own_queues, *catalogue_queues]),
            write=n.exact(
                [*SERVICE_CALLS.get(role, ()), c.EVENTS_EXCHANGE, c.DEAD_LETTER_EXCHANGE],
                raw=[own_queues, *catalogue_queues, "amq\\.default"],
            ),
            # Binding a queue to an exchange needs read on the exchange.
            read=n.exact([*served, c.EVENTS_EXCHANGE, *binds], raw=[own_queues, *catalogue_queues]),
            topics={
                # Its own queues follow policy changes (every service with a policy cache).
                n(c.EVENTS_EXCHANGE): (event_write, f"^{re.escape(c.POLICY_CHANGED)}$"),
                # A dead letter goes to the dead-letter exchange under its queue's name.
                n(c.DEAD_LETTER_EXCHANGE): (".*", "^$"),
            },
        )
    return out


def _server_of(route: str) -> str:
    """The service kind serving `route`: the middle word of its queue name (vmsched.<kind>.<what>)."""
    return c.RPC_QUEUES[route].split(".")[1]


def topology(settings: Settings, vhost: str) -> dict[str, list[dict[str, Any]]]:
    """The exchanges, queues and bindings, as the services would declare them."""
    n = Names(settings.amqp_prefix)
    work = work_queue_arguments(settings, n(c.DEAD_LETTER_EXCHANGE))

    def exchange(name: str, kind: str) -> dict[str, Any]:
        return {"name": n(name), "vhost": vhost, "type": kind, "durable": True, "auto_delete": False,
                "internal": False, "arguments": {}}  # fmt: skip

    def queue(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        return {"name": n(name), "vhost": vhost, "durable": True, "auto_delete": False, "arguments": dict(arguments)}

    def binding(exchange: str, queue: str, key: str) -> dict[str, Any]:
        return {"source": n(exchange), "vhost": vhost, "destination": n(queue), "destination_type": "queue",
                "routing_key": key, "arguments": {}}  # fmt: skip

    exchanges = [exchange(x, "direct") for x in c.RPC_EXCHANGES]
    exchanges += [exchange(c.EVENTS_EXCHANGE, "topic"), exchange(c.DEAD_LETTER_EXCHANGE, "topic")]
    queues = [queue(q, work) for q in c.RPC_QUEUES.values()]
    queues.append(queue(c.STATE_EVENTS_QUEUE, {**work, "x-single-active-consumer": True}))
    queues.append(queue(c.ENGINE_EVENTS_QUEUE, work))
    queues.append(queue(c.DEAD_LETTER_QUEUE, dead_letter_queue_arguments(settings)))
    bindings = [binding(c.rpc_exchange(route), q, route) for route, q in c.RPC_QUEUES.items()]
    bindings.append(binding(c.EVENTS_EXCHANGE, c.STATE_EVENTS_QUEUE, c.STATE_EVENTS_BINDING))
    bindings += [binding(c.EVENTS_EXCHANGE, c.ENGINE_EVENTS_QUEUE, k) for k in c.ENGINE_EVENTS_BINDINGS]
    bindings.append(binding(c.DEAD_LETTER_EXCHANGE, c.DEAD_LETTER_QUEUE, "#"))
    return {"exchanges": exchanges, "queues": queues, "bindings": bindings}


def definitions(settings: Settings, passwords: Mapping[str, str], *, roles: Iterable[str] = ROLES) -> dict[str, Any]:
    """The whole definitions document for the roles given (passwords by role, stored hashed)."""
    vhost = vhost_of(settings)
    granted = grants(settings)
    users, permissions, topic_permissions = [], [], []
    for role in roles:
        user, grant = user_name(role), granted[role]
        users.append({"name": user, "password_hash": password_hash(passwords[role]),
                      "hashing_algorithm": HASHING, "tags": []})  # fmt: skip
        permissions.append({"user": user, "vhost": vhost, "configure": grant.configure, "write": grant.write,
                            "read": grant.read})  # fmt: skip
        topic_permissions += [
            {"user": user, "vhost": vhost, "exchange": exchange, "write": write, "read": read}
            for exchange, (write, read) in grant.topics.items()
        ]
    return {
        "users": users,
        "vhosts": [{"name": vhost}],
        "permissions": permissions,
        "topic_permissions": topic_permissions,
        **topology(settings, vhost),
    }


def operator_user(name: str, password: str) -> dict[str, Any]:
    """The operator's RabbitMQ user: an administrator (management UI, rabbitmqctl-equivalent rights)."""
    return {"name": name, "password_hash": password_hash(password), "hashing_algorithm": HASHING,
            "tags": ["administrator"]}  # fmt: skip


def operator_permissions(name: str, vhost: str) -> dict[str, Any]:
    return {"user": name, "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}


__all__ = [
    "Grant",
    "definitions",
    "grants",
    "operator_permissions",
    "operator_user",
    "password_hash",
    "topology",
    "vhost_of",
]
