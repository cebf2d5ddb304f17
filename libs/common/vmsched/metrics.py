"""Prometheus metrics, one registry per process; served on VMSCHED_METRICS_PORT (vmsched.health).

Label cardinality is bounded: queue, route, status, kind, action and result labels take a fixed
set of values, and the `cluster` label goes through `cluster_label` (ClusterLabels): the first
VMSCHED_METRICS_CLUSTER_LABELS clusters a process sees keep a label of their own, later ones are
counted together under cluster="_other" (a name no cluster id can take: ids start with a letter
or a digit). So a histogram with a cluster label costs at most (limit + 1) x its buckets series.
"""

from __future__ import annotations

import platform
from collections.abc import Hashable
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)

#: The `cluster` label of every cluster past the limit (see the module docstring).
OTHER_CLUSTERS = "_other"
#: Clusters with a label of their own until the runner applies VMSCHED_METRICS_CLUSTER_LABELS.
DEFAULT_CLUSTER_LABELS = 1000

MESSAGES = Counter("vmsched_messages_total", "Messages handled, by queue and outcome", ["queue", "outcome"])
HANDLE_SECONDS = Histogram("vmsched_handle_seconds", "Time to handle one message", ["queue"], buckets=_LATENCY_BUCKETS)
DEAD_LETTERS = Counter("vmsched_dead_letters_total", "Messages dead-lettered, by queue", ["queue"])
RPC_SECONDS = Histogram("vmsched_rpc_seconds", "Client-side RPC round trip", ["route"], buckets=_LATENCY_BUCKETS)
RPC_ERRORS = Counter("vmsched_rpc_errors_total", "RPC calls that failed, by route and kind", ["route", "kind"])
DECISIONS = Counter("vmsched_decisions_total", "Schedule decisions, by cluster and status", ["cluster", "status"])
DECISION_SECONDS = Histogram(
    "vmsched_decision_seconds", "Selector time per decision, by cluster", ["cluster"], buckets=_LATENCY_BUCKETS
)
PLACED_GROUPS = Counter(
    "vmsched_place_groups_total",
    "Groups of requests placed, by where: in the selector itself or by a filter-worker (`place` call)",
    ["where"],
)
LOCK_WAIT_SECONDS = Histogram("vmsched_lock_wait_seconds", "Time waiting for a cluster lock", buckets=_LATENCY_BUCKETS)
STATE_REPORTS = Counter("vmsched_state_reports_total", "Engine state reports applied, by kind", ["kind"])

# The state tracker's gauges (vmsched_services.state_tracker.gauges).
HOSTS = Gauge("vmsched_hosts", "Hosts the state tracker holds, by cluster and status", ["cluster", "status"])
PENDING = Gauge("vmsched_pending_records", "Unexpired pending-resource records, by cluster", ["cluster"])
QUEUE_DEPTH = Gauge("vmsched_queue_depth", "Messages waiting (not yet delivered) in each service queue", ["queue"])
DEAD_LETTER_DEPTH = Gauge("vmsched_dead_letter_queue_depth", "Messages held by the dead-letter queue")

BALANCE_PASSES = Counter("vmsched_balance_passes_total", "Balancing cycles run, one per owned cluster per interval")
BALANCE_MIGRATIONS = Counter("vmsched_balance_migrations_total", "Migrations the balancer decided and published")
BALANCE_POWER_ACTIONS = Counter(
    "vmsched_balance_power_actions_total", "Power actions the balancer advised, by action", ["action"]
)

HA_CHECKS = Counter("vmsched_ha_checks_total", "HA reservation checks, by result (ok, failing, disabled)", ["result"])
HA_ALERTS = Counter("vmsched_ha_alerts_total", "HaAlert events published")
HA_RECOVERIES = Counter("vmsched_ha_recoveries_total", "HaRecovered events published")

# The api service: `route` is the route's path template (/api/v1/clusters/{cluster_id}), never the
# path a client sent, so the series stay bounded; "unmatched" for paths no route has.
HTTP_REQUESTS = Counter(
    "vmsched_http_requests_total", "HTTP API requests, by route, method and status", ["route", "method", "status"]
)
HTTP_SECONDS = Histogram(
    "vmsched_http_request_seconds", "HTTP API time per request, by route", ["route"], buckets=_LATENCY_BUCKETS
)

# The policy caches (vmsched.policy_cache.PolicyStoreWatch sets it).
POLICY_STALENESS = Gauge(
    "vmsched_policy_staleness_seconds",
    "0 while PostgreSQL answers the policy caches; while it is away, seconds since their last successful read "
    "(the policies decided with are at most that old)",
)
POLICY_STORE_UP = Gauge("vmsched_policy_store_up", "1 while PostgreSQL answers the policy caches' reads, else 0")

BUILD_INFO = Gauge("vmsched_build_info", "Always 1; the labels say what runs", ["version", "python"])


def _version() -> str:
    try:
        return package_version("vmsched")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


BUILD_INFO.labels(_version(), platform.python_version()).set(1)


class ClusterLabels:
    """The `cluster` label of a cluster id: its own for the first `limit` ids seen, then OTHER_CLUSTERS.

    A cluster keeps the label it got first for the life of the process, so its series never move.
    Called on the event loop only (no lock).
    """

    def __init__(self, limit: int = DEFAULT_CLUSTER_LABELS) -> None:
        self.limit = limit
        self._own: set[str] = set()

    def __call__(self, cluster_id: str) -> str:
        if cluster_id in self._own:
            return cluster_id
        if len(self._own) < self.limit:
            self._own.add(cluster_id)
            return cluster_id
        return OTHER_CLUSTERS

    def __len__(self) -> int:
        return len(self._own)

    def reset(self, limit: int = DEFAULT_CLUSTER_LABELS) -> None:
        """Forget the clusters seen, with `limit` from now on (tests: a fresh process's labels)."""
        self.limit = limit
        self._own.clear()


#: The process's one ClusterLabels, owned by this module like the registry whose series it bounds
#: (a second one would let the same series grow past the limit). Every series with a `cluster`
#: label goes through it; the runner alone sets its limit (set_cluster_label_limit), before any
#: service starts; tests call reset().
cluster_label = ClusterLabels()


def set_cluster_label_limit(limit: int) -> None:
    """Apply VMSCHED_METRICS_CLUSTER_LABELS to the process's labels (clusters already seen keep theirs)."""
    cluster_label.limit = limit


class ClusterGauge:
    """A gauge with a `cluster` label (first) whose value is set per cluster id.

    Several clusters can share one label (OTHER_CLUSTERS), so a cluster's value is not `set` on its
    series but added as the change since the value last exported for it: the shared series holds
    the sum over its clusters.
    """

    def __init__(self, gauge: Gauge, labels: ClusterLabels = cluster_label) -> None:
        self._gauge = gauge
        self._labels = labels
        self._exported: dict[Hashable, float] = {}

    def set(self, cluster_id: str, value: float, *labels: str) -> None:
        key = (cluster_id, *labels)
        change = value - self._exported.get(key, 0.0)
        self._exported[key] = value
        # inc(0) too: a cluster at 0 is exported as 0 rather than missing.
        self._gauge.labels(self._labels(cluster_id), *labels).inc(change)
