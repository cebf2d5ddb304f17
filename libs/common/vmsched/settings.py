"""Configuration from the environment: every field is `VMSCHED_<NAME>` (e.g. VMSCHED_AMQP_URL)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VMSCHED_", extra="ignore", frozen=True)

    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    #: Other nodes of the same RabbitMQ cluster, comma-separated AMQP URLs: connecting, and
    #: reconnecting after a lost connection, tries amqp_url and these in turn.
    amqp_failover_urls: str = ""
    #: The type of the work queues, the named event queues and the dead-letter queue: "quorum"
    #: (replicated on the cluster's nodes, kept while a majority of them runs; dead-lettering at
    #: least once) or "classic" (on one node, lost with it). A queue that already exists as the
    #: other type is used as it is, with a warning (docs/operating.md says how to convert it).
    queue_type: Literal["quorum", "classic"] = "quorum"
    redis_url: str = "redis://127.0.0.1:6379/0"
    postgres_url: str = "postgresql://127.0.0.1:5432/vmsched"

    #: Prefix of every exchange and queue name (tests run isolated under their own prefix).
    amqp_prefix: str = ""
    #: False: declare nothing on RabbitMQ (exchanges, queues, bindings), only use what
    #: `vmsched security` definitions made; for users without configure permission (an engine).
    amqp_declare: bool = True
    #: The queue a client that declares nothing (amqp_declare false) takes its events from: one
    #: the definitions bound to what that engine reads (decisions, migrations, alerts, resyncs).
    amqp_events_queue: str = "vmsched.engine.events"
    #: RabbitMQ user names (comma-separated) that may administer: policies, removing clusters and
    #: hosts, requeueing dead letters. Checked against the AMQP user_id property of the request,
    #: which the broker verifies is the user the sender connected as.
    admin_users: str = "vmsched-admin"
    #: The RabbitMQ user the policy-admin service connects as: the state tracker applies host and
    #: cluster removals (HostRemoved, ClusterRemoved) only from it or from an administrator, since
    #: policy-admin publishes them on an administrator's authorized request.
    policy_admin_user: str = "vmsched-policy-admin"

    @property
    def admin_user_names(self) -> frozenset[str]:
        """VMSCHED_ADMIN_USERS as a set."""
        return frozenset(u.strip() for u in self.admin_users.split(",") if u.strip())

    #: Prefix of every Redis key (no braces: they would break the keys' Redis Cluster hash tags).
    redis_prefix: str = "vmsched"
    #: Redis Sentinel: comma-separated host:port of the sentinels. When set, the client asks them
    #: for the master of `redis_sentinel_master` (and again after a failover); redis_url then gives
    #: only the master's password, user name and database, not its address.
    redis_sentinels: str = ""
    #: The name the sentinels monitor the master under (`sentinel monitor NAME ...`).
    redis_sentinel_master: str = "vmsched"
    #: Password of the sentinels themselves (`requirepass` in sentinel.conf), if they have one.
    redis_sentinel_password: str = ""
    #: Redis Cluster: redis_url names any one node (the others are discovered). Exclusive with
    #: redis_sentinels.
    redis_cluster: bool = False
    #: More Redis Cluster nodes to start from (comma-separated host:port): a process starting while
    #: the node of redis_url is down still finds the cluster through these.
    redis_cluster_nodes: str = ""

    #: How long a schedule request waits to take its cluster's lock (oVirt's "acquire" timeout).
    lock_acquire_timeout_s: float = Field(10.0, gt=0)
    #: The most one live holder may keep the lock: its watchdog stops renewing the lease then
    #: (oVirt's "hold" timeout), so even a holder stuck in a loop lets its cluster go.
    lock_hold_timeout_s: float = Field(15.0, gt=0)
    #: The Redis lock's time-to-live, renewed by its live holder until the hold timeout: a holder
    #: that dies or freezes frees its cluster within about this long.
    lock_lease_s: float = Field(1.0, gt=0)
    #: Default bound on one RPC: publish, queueing, processing and reply together.
    rpc_timeout_s: float = Field(10.0, gt=0)
    #: How long a pending-resource record lives if the engine never confirms or fails the start.
    pending_ttl_s: float = Field(120.0, gt=0)
    #: How long a request with no host waits for pending resources to change before its one retry.
    pending_wait_s: float = Field(2.0, ge=0)
    #: The selector sends each group of requests to a filter-worker in one `place` call, which
    #: filters, weighs and selects there. False places in the selector, asking the filter-workers to
    #: filter and the weighers to weigh, one call each per VM (scale weighers apart for policies
    #: whose weights dominate; slower: two bus hops per VM instead of one per group).
    place_in_worker: bool = True
    #: Requests for one cluster a selector decides back to back under one lock acquisition (each
    #: seeing the earlier ones as pending, as if they came one at a time); 1 decides one at a time.
    group_max: int = Field(32, ge=1, le=1000)
    #: Waiting this long raises a request's priority by one (see ScheduleRequest.priority).
    priority_aging_s: float = Field(1.0, gt=0)
    #: A cached cluster policy is re-read from PostgreSQL after this long even without a
    #: policy.changed event (one missed while the bus was down).
    policy_cache_ttl_s: float = Field(30.0, gt=0)
    #: Bound on one policy read from PostgreSQL; while PostgreSQL is away a policy cache tries it
    #: again at most every VMSCHED_READINESS_INTERVAL_S and decides with the policies it read last.
    policy_read_timeout_s: float = Field(2.0, gt=0, le=60)
    #: How long a decision is remembered for idempotent replays of the same request id.
    #: How often the state tracker asks the engine again for the full report of a cluster still
    #: waiting for one after Redis forgot it (contracts.ResyncRequested).
    resync_repeat_s: float = Field(10.0, gt=0)
    decision_ttl_s: float = Field(24 * 3600.0, gt=0)
    #: Decisions `vmsched decisions` can list per cluster (the newest; each is kept for decision_ttl_s).
    decision_history_max: int = Field(1000, ge=1, le=100_000)
    #: Unacknowledged messages one consumer holds at once.
    prefetch: int = Field(32, ge=1, le=10_000)
    #: Messages larger than this are refused (dead-lettered) before parsing.
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    #: A dead letter's body above this many bytes is kept truncated (its headers say so and give the size).
    dead_letter_max_body_bytes: int = Field(64 * 1024, ge=1024)
    #: Bytes the dead-letter queue holds at most (the oldest are dropped first), besides its bound in messages.
    dead_letter_queue_max_bytes: int = Field(256 * 1024 * 1024, ge=1024 * 1024)
    #: Attempts at a message whose handler failed transiently (Redis away) before it is dead-lettered.
    transient_attempts: int = Field(5, ge=1, le=100)
    #: Pause before a transiently failed message is tried again, times the attempts made so far.
    transient_retry_delay_s: float = Field(0.2, ge=0, le=60)
    #: How often a lost RabbitMQ connection is tried again.
    amqp_reconnect_interval_s: float = Field(1.0, gt=0, le=300)
    #: How often the balancer looks at each cluster it owns (oVirt: every minute).
    balance_interval_s: float = Field(60.0, gt=0)
    #: Migrations the balancer may start per cluster per cycle (oVirt: one).
    migrations_per_cycle: int = Field(1, ge=0, le=100)
    #: A migrated VM is not picked again for this long (no ping-pong).
    migration_cooldown_s: float = Field(600.0, ge=0)
    #: How long a host where a VM's start or migration failed is kept out of that VM's next migrations.
    failed_host_memory_s: float = Field(3600.0, gt=0)
    #: How often the HA monitor checks each cluster with HA reservation on (oVirt: every 5 minutes).
    ha_interval_s: float = Field(300.0, gt=0)
    #: How long a balancer / HA monitor owns a cluster without renewing its lease.
    lease_ttl_s: float = Field(20.0, gt=0)
    #: The longest one call of a plugin's policy unit (a filter, weight or balance function from
    #: another package) may take: a longer call fails the decision it was part of, naming the unit.
    plugin_call_limit_s: float = Field(0.5, gt=0)
    #: Each service instance announces its policy units in Redis for this long, renewed every third
    #: of it while it runs: a dead instance's catalogue is gone this long after its last renewal.
    unit_catalogue_ttl_s: float = Field(30.0, gt=0)
    #: Port for the Prometheus metrics endpoint; 0 disables it.
    metrics_port: int = Field(0, ge=0, le=65535)
    #: Clusters that get a `cluster` label of their own on metrics (the first seen by the process);
    #: later ones are counted together under cluster="_other", so series stay bounded.
    metrics_cluster_labels: int = Field(1000, ge=0, le=1_000_000)
    #: How often the state tracker refreshes the gauges it reads from Redis and the broker
    #: (pending records, queue depths); only when metrics_port is set.
    metrics_refresh_s: float = Field(15.0, gt=0)
    #: Bound on each /readyz check (bus, Redis, PostgreSQL) and on the event loop's answer to /healthz.
    health_timeout_s: float = Field(1.0, gt=0, le=30)
    #: How often a service process checks that Redis answers, to stop consuming while it does not
    #: (and consume again once it does).
    readiness_interval_s: float = Field(1.0, gt=0, le=60)
    log_level: str = "INFO"
    #: "json" for structlog JSON lines, "console" for a human.
    log_format: str = "json"
