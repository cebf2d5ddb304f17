"""Every name that crosses a process boundary: exchanges, queues, routing keys, Redis keys.

One place, so a newcomer (or an engine written in another language) can see the whole wire
layout at a glance, and so no service spells a queue name by hand. `contracts/asyncapi.json` is
generated from these and from the message models.
"""

from __future__ import annotations

from typing import Final

SCHEMA_VERSION: Final = 1

#: The Python entry point group other packages add policy units through (each entry point loads to
#: a PolicyUnit or a sequence of them; vmsched.scheduling.units.plugins loads them).
UNIT_ENTRY_POINT_GROUP: Final = "vmsched.units"

# ---------------------------------------------------------------- RabbitMQ: exchanges
# Calls go to three direct exchanges, one per audience, because RabbitMQ grants write permission
# per exchange (not per routing key on a direct exchange): an engine may write to RPC_EXCHANGE only,
# services to INTERNAL_EXCHANGE too, administrators to ADMIN_EXCHANGE (see RPC_ROUTE_EXCHANGES).
#: Direct exchange for the engine's calls (schedule, state, ha-check, whatif, clusters.list, decisions.*).
RPC_EXCHANGE: Final = "vmsched.rpc"
#: Direct exchange for the services' calls to each other (place, filter, weigh).
INTERNAL_EXCHANGE: Final = "vmsched.internal"
#: Direct exchange for administration: policies, removing clusters and hosts, requeueing dead letters.
ADMIN_EXCHANGE: Final = "vmsched.admin"
#: The call exchanges (see RPC_ROUTE_EXCHANGES).
RPC_EXCHANGES: Final = (RPC_EXCHANGE, INTERNAL_EXCHANGE, ADMIN_EXCHANGE)
#: Topic exchange for events: engine state in, decisions and policy changes out.
EVENTS_EXCHANGE: Final = "vmsched.events"
#: Where every message a service could not process goes, with the reason in its headers.
DEAD_LETTER_EXCHANGE: Final = "vmsched.dlx"
DEAD_LETTER_QUEUE: Final = "vmsched.dead-letter"

# ---------------------------------------------------------------- RabbitMQ: RPC routing keys
RPC_SCHEDULE: Final = "schedule"
RPC_FILTER: Final = "filter"
RPC_PLACE: Final = "place"
RPC_WEIGH: Final = "weigh"
RPC_STATE: Final = "state"
RPC_HA_CHECK: Final = "ha-check"
#: Policy administration (the policy-admin service, the only writer of policies).
RPC_POLICY_READ: Final = "policy.read"
RPC_POLICY_APPLY: Final = "policy.apply"
RPC_POLICY_CLONE: Final = "policy.clone"
RPC_POLICY_DELETE: Final = "policy.delete"
RPC_POLICY_DETACH: Final = "policy.detach"
RPC_POLICY_HISTORY: Final = "policy.history"
RPC_POLICY_ROLLBACK: Final = "policy.rollback"
RPC_UNITS_LIST: Final = "units.list"
#: Destructive administration (served by policy-admin, which authorizes and audits it).
RPC_CLUSTERS_REMOVE: Final = "clusters.remove"
RPC_HOSTS_REMOVE: Final = "hosts.remove"
RPC_DEAD_LETTERS_REQUEUE: Final = "dead-letters.requeue"
RPC_AUDIT: Final = "audit.read"
#: Reads for an engine, an integrator or the HTTP API: the clusters with state, the stored decisions
#: (served by the state tracker, which has the state and the decisions in Redis) and what-if
#: placements (served by the selector: the schedule path without the lock, pending, store or event).
RPC_CLUSTERS_LIST: Final = "clusters.list"
RPC_DECISIONS_RECENT: Final = "decisions.recent"
RPC_DECISIONS_GET: Final = "decisions.get"
RPC_WHATIF: Final = "whatif"

#: Queue consumed by each RPC service; the routing key binds the queue on RPC_EXCHANGE.
RPC_QUEUES: Final[dict[str, str]] = {
    RPC_SCHEDULE: "vmsched.selector.schedule",
    RPC_FILTER: "vmsched.filter-worker.filter",
    RPC_PLACE: "vmsched.filter-worker.place",
    RPC_WEIGH: "vmsched.weigher.weigh",
    RPC_STATE: "vmsched.state-tracker.state",
    RPC_HA_CHECK: "vmsched.ha-monitor.check",
    RPC_POLICY_READ: "vmsched.policy-admin.read",
    RPC_POLICY_APPLY: "vmsched.policy-admin.apply",
    RPC_POLICY_CLONE: "vmsched.policy-admin.clone",
    RPC_POLICY_DELETE: "vmsched.policy-admin.delete",
    RPC_POLICY_DETACH: "vmsched.policy-admin.detach",
    RPC_POLICY_HISTORY: "vmsched.policy-admin.history",
    RPC_POLICY_ROLLBACK: "vmsched.policy-admin.rollback",
    RPC_UNITS_LIST: "vmsched.policy-admin.units",
    RPC_CLUSTERS_REMOVE: "vmsched.policy-admin.clusters-remove",
    RPC_HOSTS_REMOVE: "vmsched.policy-admin.hosts-remove",
    RPC_DEAD_LETTERS_REQUEUE: "vmsched.policy-admin.dead-letters-requeue",
    RPC_AUDIT: "vmsched.policy-admin.audit",
    RPC_CLUSTERS_LIST: "vmsched.state-tracker.clusters",
    RPC_DECISIONS_RECENT: "vmsched.state-tracker.decisions-recent",
    RPC_DECISIONS_GET: "vmsched.state-tracker.decisions-get",
    RPC_WHATIF: "vmsched.selector.whatif",
}

#: Routes under an administrative prefix that are reads anyone who may call the engine's routes may
#: make: they go to RPC_EXCHANGE (clusters.list lists; clusters.remove removes).
ENGINE_READS: Final = frozenset({RPC_CLUSTERS_LIST})

#: The exchange each route's requests are published to (RPC_EXCHANGE for a route not named here).
RPC_ROUTE_EXCHANGES: Final[dict[str, str]] = {
    RPC_PLACE: INTERNAL_EXCHANGE,
    RPC_FILTER: INTERNAL_EXCHANGE,
    RPC_WEIGH: INTERNAL_EXCHANGE,
    **{
        route: ADMIN_EXCHANGE
        for route in RPC_QUEUES
        if route.startswith(("policy.", "units.", "clusters.", "hosts.", "dead-letters.", "audit."))
        and route not in ENGINE_READS
    },
}


#: Routes whose workers may differ in their policy units (plugins): each worker also consumes
#: "<route>.<catalogue>" (queue "<the route's queue>.<catalogue>"), shared by the workers whose unit
#: catalogues hash alike, and the selector sends a policy some workers lack units of there
#: (vmsched.lifecycle.routes). The service serving each.
CATALOGUE_ROUTES: Final[dict[str, str]] = {
    RPC_PLACE: "filter-worker",
    RPC_FILTER: "filter-worker",
    RPC_WEIGH: "weigher",
}
#: Hex digits of a catalogue's hash (vmsched.store.catalogues.catalogue_hash).
CATALOGUE_HASH_LENGTH: Final = 12
#: A catalogue route's queue no worker has consumed for this long is deleted by the broker (x-expires):
#: catalogues change with every plugin version, and a queue named after an old one would stay for ever.
#: Long enough that no outage of Redis (workers pause their consumers meanwhile) outlasts it.
CATALOGUE_QUEUE_EXPIRES_MS: Final = 24 * 3600 * 1000


def catalogue_route(route: str, catalogue: str) -> str:
    """The route of `route` for the workers whose unit catalogue hashes to `catalogue`."""
    return f"{route}.{catalogue}"


def catalogue_base(route: str) -> str | None:
    """The route a catalogue route ("place.<hash>") is one of; None for any other route."""
    base, dot, catalogue = route.rpartition(".")
    if dot and base in CATALOGUE_ROUTES and len(catalogue) == CATALOGUE_HASH_LENGTH:
        return base
    return None


def rpc_queue(route: str) -> str:
    """The queue `route`'s servers consume (before the configured prefix): RPC_QUEUES for the
    services' routes, "<queue>.<catalogue>" for a catalogue route, "vmsched.<route>" otherwise."""
    if route in RPC_QUEUES:
        return RPC_QUEUES[route]
    base = catalogue_base(route)
    if base is not None:
        return f"{RPC_QUEUES[base]}.{route.rpartition('.')[2]}"
    return f"vmsched.{route}"


def rpc_exchange(route: str) -> str:
    """The exchange `route`'s requests go to (before the configured prefix)."""
    return RPC_ROUTE_EXCHANGES.get(catalogue_base(route) or route, RPC_EXCHANGE)


# ---------------------------------------------------------------- RabbitMQ: event routing keys
# Keys end in the cluster id so a subscriber can bind to one cluster ("decision.c1") or all ("decision.*").
HOST_REPORT_PREFIX: Final = "state.host"
VM_REPORT_PREFIX: Final = "state.vm"
#: Several of one cluster's host and VM reports in one message (contracts.StateReports).
STATE_REPORTS_PREFIX: Final = "state.reports"
CLUSTER_REPORT_PREFIX: Final = "state.cluster"
HOST_REMOVED_PREFIX: Final = "state.host-removed"
CLUSTER_REMOVED_PREFIX: Final = "state.cluster-removed"
#: vmsched asks the engine for a full report (contracts.ResyncRequested); the engine says it sent one.
RESYNC_REQUESTED_PREFIX: Final = "state.resync-requested"
RESYNC_COMPLETE_PREFIX: Final = "state.resync-complete"
DECISION_PREFIX: Final = "decision"
MIGRATION_PREFIX: Final = "migration"
POWER_PREFIX: Final = "power"
#: A host in maintenance: the plan that empties it (contracts.MaintenancePlan).
MAINTENANCE_PREFIX: Final = "maintenance"
HA_ALERT_PREFIX: Final = "ha.alert"
HA_RECOVERED_PREFIX: Final = "ha.recovered"
POLICY_CHANGED: Final = "policy.changed"

#: Durable queue of the state tracker: every engine state report, in order.
STATE_EVENTS_QUEUE: Final = "vmsched.state-tracker.events"
STATE_EVENTS_BINDING: Final = "state.#"
#: A subscription's own exclusive queue is named "vmsched.own.<service>.<random>": named after the
#: service so a RabbitMQ permission can let each role make its own queues and no others.
OWN_QUEUE_PREFIX: Final = "vmsched.own"


def own_queue(service: str, token: str) -> str:
    return f"{OWN_QUEUE_PREFIX}.{service}.{token}"


#: The queue `vmsched security` definitions make for an engine that declares nothing
#: (VMSCHED_AMQP_EVENTS_QUEUE), bound to everything vmsched tells an engine.
ENGINE_EVENTS_QUEUE: Final = "vmsched.engine.events"
ENGINE_EVENTS_BINDINGS: Final = (
    f"{DECISION_PREFIX}.*",
    f"{MIGRATION_PREFIX}.*",
    f"{POWER_PREFIX}.*",
    f"{MAINTENANCE_PREFIX}.*",
    f"{HA_ALERT_PREFIX}.*",
    f"{HA_RECOVERED_PREFIX}.*",
    f"{RESYNC_REQUESTED_PREFIX}.*",
)
#: Durable queues whose consumers take turns (RabbitMQ's single active consumer): the broker
#: delivers to one of them at a time, in queue order, and hands the queue (with what the active one
#: held unacknowledged, back in order) to the next when that one goes. Several state trackers can
#: then run: one applies the reports in the order the engine published them, the others stand by.
SINGLE_ACTIVE_QUEUES: Final = frozenset({STATE_EVENTS_QUEUE})


def host_report_key(cluster_id: str) -> str:
    return f"{HOST_REPORT_PREFIX}.{cluster_id}"


def vm_report_key(cluster_id: str) -> str:
    return f"{VM_REPORT_PREFIX}.{cluster_id}"


def state_reports_key(cluster_id: str) -> str:
    return f"{STATE_REPORTS_PREFIX}.{cluster_id}"


def cluster_report_key(cluster_id: str) -> str:
    return f"{CLUSTER_REPORT_PREFIX}.{cluster_id}"


def host_removed_key(cluster_id: str) -> str:
    return f"{HOST_REMOVED_PREFIX}.{cluster_id}"


def cluster_removed_key(cluster_id: str) -> str:
    return f"{CLUSTER_REMOVED_PREFIX}.{cluster_id}"


def resync_requested_key(cluster_id: str) -> str:
    return f"{RESYNC_REQUESTED_PREFIX}.{cluster_id}"


def resync_complete_key(cluster_id: str) -> str:
    return f"{RESYNC_COMPLETE_PREFIX}.{cluster_id}"


def decision_key(cluster_id: str) -> str:
    return f"{DECISION_PREFIX}.{cluster_id}"


def migration_key(cluster_id: str) -> str:
    return f"{MIGRATION_PREFIX}.{cluster_id}"


def power_key(cluster_id: str) -> str:
    return f"{POWER_PREFIX}.{cluster_id}"


def maintenance_key(cluster_id: str) -> str:
    return f"{MAINTENANCE_PREFIX}.{cluster_id}"


def ha_alert_key(cluster_id: str) -> str:
    return f"{HA_ALERT_PREFIX}.{cluster_id}"


def ha_recovered_key(cluster_id: str) -> str:
    return f"{HA_RECOVERED_PREFIX}.{cluster_id}"


#: Events whose routing key is "<prefix>.<the body's cluster_id>", by message type (the AMQP `type`
#: property): a subscriber refuses one whose routing key says otherwise (vmsched.bus.dispatch).
CLUSTER_KEYED_EVENTS: Final[dict[str, str]] = {
    "ClusterReport": CLUSTER_REPORT_PREFIX,
    "HostReport": HOST_REPORT_PREFIX,
    "VmReport": VM_REPORT_PREFIX,
    "StateReports": STATE_REPORTS_PREFIX,
    "HostRemoved": HOST_REMOVED_PREFIX,
    "ClusterRemoved": CLUSTER_REMOVED_PREFIX,
    "ResyncRequested": RESYNC_REQUESTED_PREFIX,
    "ResyncComplete": RESYNC_COMPLETE_PREFIX,
    "ScheduleDecision": DECISION_PREFIX,
    "MigrationDecision": MIGRATION_PREFIX,
    "PowerAction": POWER_PREFIX,
    "MaintenancePlan": MAINTENANCE_PREFIX,
    "HaAlert": HA_ALERT_PREFIX,
    "HaRecovered": HA_RECOVERED_PREFIX,
}


# ---------------------------------------------------------------- AMQP headers
#: Set on an RPC reply that carries an ErrorReply instead of the normal reply model.
HEADER_ERROR: Final = "x-vmsched-error"
#: Set on a dead-lettered message: why it was rejected, and by which service.
HEADER_DLX_REASON: Final = "x-vmsched-reason"
HEADER_DLX_SERVICE: Final = "x-vmsched-service"
HEADER_DLX_ROUTING_KEY: Final = "x-vmsched-original-routing-key"
#: The exchange the message was published to ("" for the default exchange), so it can be requeued there.
HEADER_DLX_EXCHANGE: Final = "x-vmsched-original-exchange"
#: When it was dead-lettered (unix time in integer milliseconds) and a short id naming it for tools.
HEADER_DLX_TIME: Final = "x-vmsched-dead-lettered-ms"
HEADER_DLX_ID: Final = "x-vmsched-dead-letter-id"
#: How many hex digits a dead letter's id has (tools tell an id from a position by it: an id may be
#: all digits).
DEAD_LETTER_ID_LENGTH: Final = 12

# ---------------------------------------------------------------- Redis keys
# All keys start with the configured prefix (default "vmsched"), which tests vary for isolation.
# Helpers in vmsched.store.keys build the full names; the suffixes live here. `{{cluster}}` is the
# cluster id in literal braces, a Redis Cluster hash tag: one cluster's keys share one slot.
KEY_LOCK: Final = "lock"  # {prefix}:lock:{{cluster}} -> "owner:token", PX = hold timeout
KEY_FENCE: Final = "fence"  # {prefix}:fence:{{cluster}} -> last fencing token issued (INCR)
KEY_PENDING: Final = "pending"  # {prefix}:pending:{{cluster}} -> hash vm_id -> PendingEntry json
KEY_PENDING_VERSION: Final = "pending-version"  # {prefix}:pending-version:{{cluster}} -> INCR on change
KEY_STATE_VERSION: Final = "state:version"  # {prefix}:state:version:{{cluster}} -> int
KEY_STATE_HOSTS: Final = "state:hosts"  # {prefix}:state:hosts:{{cluster}} -> hash host_id -> HostState json
KEY_STATE_VMS: Final = "state:vms"  # {prefix}:state:vms:{{cluster}} -> hash vm_id -> VmState json
KEY_STATE_CLUSTER: Final = "state:cluster"  # {prefix}:state:cluster:{{cluster}} -> ClusterSettings json
KEY_STATE_CHANGES: Final = "state:changes"  # {prefix}:state:changes:{{cluster}} -> stream, id = version
KEY_STATE_REMOVED: Final = "state:removed"  # {prefix}:state:removed:{{cluster}} -> version at removal
KEY_CLUSTERS: Final = "clusters"  # {prefix}:clusters -> set of cluster ids
KEY_DECISION: Final = "decision"  # {prefix}:decision:{{cluster}}:{request_id} -> ScheduleDecision json (idempotency)
KEY_DECISION_HISTORY: Final = "decision-history"  # {prefix}:decision-history:{{cluster}} -> zset request id by time
KEY_LEASE: Final = "lease"  # {prefix}:lease:{role}:{{cluster}} -> owner id, PX = lease time
KEY_COOLDOWN: Final = "cooldown"  # {prefix}:cooldown:{{cluster}}:{vm} -> set while a migrated VM rests
KEY_TRIED: Final = "tried"  # {prefix}:tried:{{cluster}}:{vm} -> set of hosts where a start/migration failed
KEY_MIGRATION_BUDGET: Final = "migration-budget"  # {prefix}:migration-budget:{{cluster}} -> zset of moves by time
KEY_HA_STATE: Final = "ha-state"  # {prefix}:ha-state:{{cluster}} -> json list of failing hosts
KEY_MAINTENANCE: Final = "maintenance"  # {prefix}:maintenance:{{cluster}} -> hash host -> json plan and step of a drain
KEY_UNITS: Final = "units"  # {prefix}:units:{units}:{service}:{instance} -> json units, PX = catalogue TTL
KEY_UNITS_INDEX: Final = "units-index"  # {prefix}:units-index:{units} -> zset of KEY_UNITS keys by expiry (ms)
KEY_GENERATION: Final = "generation"  # {prefix}:generation:{{cluster}} -> "generation server-run-id": Redis still knows
KEY_RESYNC: Final = "resync"  # {prefix}:resync:{{cluster}} -> set while the engine owes a full report after a loss

#: Lease roles (the {role} of KEY_LEASE): each cluster is worked by one process per role.
LEASE_BALANCER: Final = "balancer"
LEASE_HA_MONITOR: Final = "ha-monitor"

#: How many state changes a cluster's change stream keeps before a reader must reload in full.
STATE_CHANGES_MAXLEN: Final = 10_000
