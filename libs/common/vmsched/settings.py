"""Configuration from the environment: every field is `VMSCHED_<NAME>` (e.g. VMSCHED_AMQP_URL), or the
contents of the file `VMSCHED_<NAME>_FILE` names (secrets as Docker and Kubernetes mount them)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

from pydantic import Field, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from vmsched.errors import SettingsFileError

#: The schemes each server URL may have, and what a right URL looks like (for the message).
URL_FORMS: dict[str, tuple[tuple[str, ...], str]] = {
    "amqp": (("amqp", "amqps"), "amqp://user:password@host:5672/ (or amqps://... for TLS, port 5671)"),
    "redis": (("redis", "rediss", "unix"), "redis://[user:password@]host:6379/0 (or rediss://... for TLS)"),
    "postgres": (
        ("postgresql", "postgres"),
        "postgresql://user[:password]@host:5432/vmsched (add ?sslmode=verify-full for TLS)",
    ),
}


#: The standard OpenTelemetry variable, read when VMSCHED_TRACING_ENDPOINT is not set.
OTEL_ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"


def url_problem(url: str, server: str) -> str | None:
    """What is wrong with `url` as the URL of a `server` ("amqp", "redis", "postgres"), else None:
    its scheme, host and port are checked (the first of those that is wrong is named)."""
    schemes, form = URL_FORMS[server]
    shown = repr(redacted_url(url))
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"{shown} cannot be read ({exc}): write {form}"
    if not parts.scheme or (not parts.netloc and parts.scheme not in schemes):
        return f"{shown} has no scheme: write {form}"
    if parts.scheme not in schemes:
        return f"{shown} has the scheme {parts.scheme}://, not {' or '.join(f'{x}://' for x in schemes)}: write {form}"
    if parts.scheme == "unix":
        return None if parts.path else f"{shown} names no socket path: write unix:///path/to/redis.sock"
    if server == "postgres" and ("," in parts.netloc or not parts.hostname):
        return None  # several hosts, or the local Unix socket: libpq's forms, left to the driver
    try:
        port = parts.port
    except ValueError as exc:  # a port that is not a number, or out of range
        return f"{shown} has a bad port ({exc}): write {form}"
    if not parts.hostname:
        return f"{shown} names no host: write {form}"
    if port == 0:
        return f"{shown} has port 0: write {form}"
    return None


def _checked_url(value: str, field: str, server: str) -> str:
    problem = url_problem(value, server)
    if problem is not None:
        raise ValueError(f"VMSCHED_{field.upper()}={problem}")
    return value


class Settings(BaseSettings):
    # hide_input_in_errors: a URL that does not validate may carry a password; the checks redact it.
    model_config = SettingsConfigDict(env_prefix="VMSCHED_", extra="ignore", frozen=True, hide_input_in_errors=True)

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
    # TLS (docs/operating.md, "TLS"): a connection is TLS when its URL says so (amqps://, rediss://,
    # PostgreSQL ?sslmode=require, verify-ca or verify-full; for Redis the sentinels and every cluster
    # node too). The server's certificate is always verified: against the CA file given, else the
    # system's CAs; the host name is checked too except with sslmode=verify-ca. Files are PEM.
    #: The CA that signed RabbitMQ's certificate (empty: the system's CAs).
    amqp_tls_ca_file: str = ""
    #: The client certificate RabbitMQ asks for (its `ssl_options.fail_if_no_peer_cert`), if any.
    amqp_tls_cert_file: str = ""
    #: The client certificate's private key (empty: it is in amqp_tls_cert_file).
    amqp_tls_key_file: str = ""
    #: The CA that signed Redis's certificate (empty: the system's CAs).
    redis_tls_ca_file: str = ""
    #: The client certificate Redis asks for (`tls-auth-clients yes`), if any.
    redis_tls_cert_file: str = ""
    #: The client certificate's private key (empty: it is in redis_tls_cert_file).
    redis_tls_key_file: str = ""
    #: The CA that signed PostgreSQL's certificate (empty: the system's CAs).
    postgres_tls_ca_file: str = ""
    #: The client certificate PostgreSQL asks for (`clientcert=verify-ca` in pg_hba.conf), if any.
    postgres_tls_cert_file: str = ""
    #: The client certificate's private key (empty: it is in postgres_tls_cert_file).
    postgres_tls_key_file: str = ""

    @field_validator("amqp_url", "redis_url", "postgres_url", mode="after")
    @classmethod
    def _server_url(cls, value: str, info: ValidationInfo) -> str:
        # Checked at start: a URL without its scheme made the AMQP client wait forever, silently.
        field = str(info.field_name)
        return _checked_url(value, field, field.removesuffix("_url"))

    @field_validator("amqp_failover_urls", mode="after")
    @classmethod
    def _failover_urls(cls, value: str) -> str:
        for url in (u.strip() for u in value.split(",")):
            if url:
                _checked_url(url, "amqp_failover_urls", "amqp")
        return value

    @field_validator(
        "amqp_tls_ca_file",
        "amqp_tls_cert_file",
        "amqp_tls_key_file",
        "redis_tls_ca_file",
        "redis_tls_cert_file",
        "redis_tls_key_file",
        "postgres_tls_ca_file",
        "postgres_tls_cert_file",
        "postgres_tls_key_file",
        mode="after",
    )
    @classmethod
    def _tls_file(cls, value: str, info: ValidationInfo) -> str:
        if value and not Path(value).is_file():
            raise ValueError(f"VMSCHED_{str(info.field_name).upper()}={value!r} is not a file")
        return value

    #: Prefix of every exchange and queue name (tests run isolated under their own prefix).
    amqp_prefix: str = ""
    #: False: declare no exchange, durable queue or binding on RabbitMQ, only use what the
    #: `vmsched security` definitions made (for users without configure permission on them). A
    #: subscription's own exclusive queue is still declared, unless amqp_events_queue is set.
    amqp_declare: bool = True
    #: A queue the definitions made for one client (an engine: vmsched.engine.events), bound to
    #: what it reads: its subscriptions share it instead of declaring queues of their own, so it
    #: needs no configure permission at all. Empty: each subscription has its own exclusive queue.
    amqp_events_queue: str = ""
    #: RabbitMQ user names (comma-separated) that may administer: policies, removing clusters and
    #: hosts, requeueing dead letters. Checked against the AMQP user_id property of the request,
    #: which the broker verifies is the user the sender connected as.
    admin_users: str = "vmsched-admin"
    #: The RabbitMQ user the policy-admin service connects as: the state tracker applies host and
    #: cluster removals (HostRemoved, ClusterRemoved) only from it or from an administrator, since
    #: policy-admin publishes them on an administrator's authorized request.
    policy_admin_user: str = "vmsched-policy-admin"

    @property
    def amqp_user(self) -> str | None:
        """The user VMSCHED_AMQP_URL logs in as (None when it names none: a certificate's)."""
        return urlsplit(self.amqp_url).username or None

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
    #: With place_in_worker, the selector places a group itself when it is small enough
    #: (lifecycle.placing.LOCAL_PLACE_MAX_WORK host-VM evaluations) and every unit of its policy is
    #: installed here: the same placement code, one bus hop less per group (a third less CPU per
    #: decision); larger groups, and policies with units only workers have, go to the filter-workers.
    place_in_selector: bool = True
    #: Requests for one cluster a selector decides back to back under one lock acquisition (each
    #: seeing the earlier ones as pending, as if they came one at a time); 1 decides one at a time.
    group_max: int = Field(32, ge=1, le=1000)
    #: The services' event loop: asyncio's own, or uvloop (libuv; less CPU per message): "auto" takes
    #: it when installed, "uvloop" insists on it (a service refuses to start without it). Not the
    #: default yet: under the hostile-input experiment a filter-worker on uvloop grew 19-20.5 MB
    #: against 10-12 MB on asyncio's loop, at the edge of the 20 MB bound.
    event_loop: Literal["auto", "uvloop", "asyncio"] = "asyncio"
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
    #: Whether this process loads the policy units of installed plugins (the `vmsched.units` entry
    #: points); false: the built-in units only, as on a machine without the plugins. Read by a service
    #: process when it starts.
    plugins: bool = True
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
    # The api service (vmsched_services.api, docs/http-api.md): the HTTP API and the web console.
    #: Address the HTTP API listens on: loopback by default; 0.0.0.0 (every interface) behind a proxy
    #: or in a container.
    api_host: str = "127.0.0.1"
    #: Port of the HTTP API (0: one the system chooses, logged at start; for tests).
    api_port: int = Field(8080, ge=0, le=65535)
    #: The API's bearer tokens, one `NAME ROLE sha256:HEX` line each (`vmsched api token add` writes
    #: them); usually given as a file, VMSCHED_API_TOKENS_FILE. Empty: every /api/v1 request is refused
    #: (401): there are no default credentials.
    api_tokens: str = ""
    #: RabbitMQ users (comma-separated) trusted to say on whose behalf they ask (the api service's
    #: users): policy-admin records "<user> for <name>" as the actor of their writes; the header from
    #: any other sender is ignored (and logged).
    api_users: str = "vmsched-api"
    #: The largest request body the HTTP API reads; a bigger one is refused (413) unread.
    api_max_body_bytes: int = Field(1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    #: Bounds of one simulation run through the HTTP API (POST /api/v1/simulations).
    api_simulation_max_hosts: int = Field(200, ge=1, le=10_000)
    api_simulation_max_hours: float = Field(24.0, gt=0, le=24 * 30)
    api_simulation_timeout_s: float = Field(60.0, gt=0, le=3600)
    #: Simulations the api runs at once (each in a worker thread); more wait for a slot.
    api_simulation_concurrency: int = Field(1, ge=1, le=64)
    #: Events one server-sent-events client may have waiting; a client that reads slower loses the
    #: oldest (and is told how many with an `event: dropped`).
    api_events_queue: int = Field(1000, ge=1, le=1_000_000)
    #: Seconds between the keep-alive comments of an idle event stream.
    api_events_keepalive_s: float = Field(15.0, gt=0, le=3600)

    @property
    def api_user_names(self) -> frozenset[str]:
        """VMSCHED_API_USERS as a set."""
        return frozenset(u.strip() for u in self.api_users.split(",") if u.strip())

    #: Address the metrics and health endpoint listens on (with metrics_port set): loopback by
    #: default, so only the host's own scraper and health checks reach it; 0.0.0.0 (every interface)
    #: for a Prometheus or a health check in another container or on another host.
    metrics_host: str = "127.0.0.1"

    #: Tracing (docs/operating.md, "Tracing"): the OTLP/HTTP endpoint spans are sent to, a base URL
    #: such as http://jaeger:4318 (/v1/traces is added) or the full traces URL. Empty: tracing is off
    #: (opentelemetry is not even imported), unless the standard OTEL_EXPORTER_OTLP_ENDPOINT is set,
    #: which is read when this is not.
    tracing_endpoint: str = Field(default_factory=lambda: os.environ.get(OTEL_ENDPOINT_VARIABLE, ""))
    #: The share of decisions traced that start their trace here (an engine's sampled trace is
    #: followed whatever this says): 1 traces every one, 0.01 one in a hundred.
    tracing_sample_ratio: float = Field(1.0, ge=0, le=1)

    @field_validator("tracing_endpoint", mode="after")
    @classmethod
    def _tracing_endpoint(cls, value: str) -> str:
        if not value:
            return value
        try:
            parts = urlsplit(value)
            host = parts.hostname
            parts.port  # noqa: B018 (reading it checks it)
        except ValueError as exc:
            raise ValueError(f"VMSCHED_TRACING_ENDPOINT={redacted_url(value)!r} cannot be read ({exc})") from None
        if parts.scheme not in ("http", "https") or not host:
            raise ValueError(
                f"VMSCHED_TRACING_ENDPOINT={redacted_url(value)!r} is not an OTLP/HTTP URL: write "
                "http://host:4318 (or https://...), or leave it empty for no tracing"
            )
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # After the environment: a setting given both ways is refused (VariableFileSource), so the
        # order only ranks the two under the constructor's keyword arguments.
        return init_settings, env_settings, VariableFileSource(settings_cls), dotenv_settings, file_secret_settings

    def secret_values(self) -> frozenset[str]:
        """The credentials these settings hold (passwords of the URLs, the secret fields), as they are
        and as written in a URL, less those of the built-in defaults (guest's password is no secret):
        what vmsched.logging masks wherever it appears in a log line."""
        return _secrets_of(self) - _secrets_of(_DEFAULTS)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # repr() and str() name a URL without its password and show a secret field as set or not:
        # a Settings in a log line, an error or a debugger's output gives nothing away.
        for name, value in super().__repr_args__():
            yield name, _hidden(name, value) if isinstance(name, str) and isinstance(value, str) else value


# ---------------------------------------------------------------- secrets
#: A field holding a secret whole (a password, a token); any later field so named is covered too.
_SECRET_WORDS = ("password", "secret", "token", "passphrase")
#: Query parameters of a server URL that carry a password (redis-py and asyncpg read them).
_PASSWORD_PARAMS = frozenset({"password", "sslpassword"})
_PASSWORD_QUERY = re.compile(r"(?i)(^|&)(password|sslpassword)=[^&]*")


def is_secret_field(name: str) -> bool:
    """A setting whose whole value is a secret (hidden entirely, not just a URL's password)."""
    return any(word in name for word in _SECRET_WORDS)


def is_url_field(name: str) -> bool:
    """A setting holding server URLs (comma-separated for `_urls`; `_endpoint`: the tracing
    collector's), whose passwords are secret."""
    return name.endswith(("_url", "_urls", "_endpoint"))


def url_passwords(urls: str) -> set[str]:
    """The passwords in comma-separated URLs: user-info and password query parameters, each as written
    (percent-encoded) and decoded."""
    found: set[str] = set()
    for url in (u.strip() for u in urls.split(",")):
        try:
            parts = urlsplit(url)
            raw = [parts.password] if parts.password else []
        except ValueError:  # not a URL: the whole of it may be anything, a password too
            found.add(url)
            continue
        raw += [v for k, vs in parse_qs(parts.query).items() if k.lower() in _PASSWORD_PARAMS for v in vs]
        for value in raw:
            found |= {value, unquote(value)}
    return {v for v in found if v}


def redacted_url(urls: str) -> str:
    """Comma-separated URLs with every password (user-info, password query parameters) replaced by
    `***`; user, host, port, path and the other parameters kept."""
    return ",".join(_redacted_one(url) for url in urls.split(","))


def _redacted_one(url: str) -> str:
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            userinfo, _, hostport = netloc.rpartition("@")
            netloc = f"{userinfo.partition(':')[0]}:***@{hostport}"
    except ValueError:  # not a URL: it may be anything, a password too
        return "***"
    query = _PASSWORD_QUERY.sub(r"\1\2=***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _hidden(name: str, value: str) -> str:
    if is_secret_field(name):
        return "***" if value else ""
    return redacted_url(value) if is_url_field(name) else value


def _secrets_of(settings: BaseSettings) -> frozenset[str]:
    found: set[str] = set()
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if not isinstance(value, str) or not value:
            continue
        if is_secret_field(name):
            found.add(value)
        elif is_url_field(name):
            found |= url_passwords(value)
    return frozenset(found)


# ---------------------------------------------------------------- VMSCHED_<NAME>_FILE
class VariableFileSource(PydanticBaseSettingsSource):
    """Each setting read from the file `VMSCHED_<NAME>_FILE` names, as Docker and Kubernetes mount
    secrets (`/run/secrets/...`): the file's text less its trailing newline. Refused
    (SettingsFileError) when `VMSCHED_<NAME>` is set as well, or the file cannot be read."""

    SUFFIX = "_FILE"

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None = None) -> None:
        super().__init__(settings_cls)
        self.prefix = str(settings_cls.model_config.get("env_prefix", "")).upper()
        # Matched without regard to case, as pydantic-settings matches VMSCHED_<NAME> itself.
        env = os.environ if environ is None else environ
        self.environ = {k.upper(): v for k, v in env.items()}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = f"{self.prefix}{field_name.upper()}"
        path = self.environ.get(variable + self.SUFFIX)
        if path is None:
            return None, field_name, False
        if variable in self.environ:
            raise SettingsFileError(
                f"both {variable} and {variable}{self.SUFFIX} are set; set only one (the file for a secret)"
            )
        return _read_value(variable + self.SUFFIX, path), field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            value, key, _ = self.get_field_value(field, name)
            if value is not None:
                values[key] = value
        return values


def _read_value(variable: str, path: str) -> str:
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        # strerror only: the exception's own text is fine, but says nothing more.
        raise SettingsFileError(f"{variable}: cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # its message quotes a byte of the file
        raise SettingsFileError(f"{variable}: {path} is not UTF-8 text") from None
    # `echo secret > file` and editors end the file with a newline that is not part of the value.
    return text.rstrip("\r\n")


#: The built-in defaults (no environment read), whose credentials are public.
_DEFAULTS = Settings.model_construct()
