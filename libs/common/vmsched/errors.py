"""Every exception vmsched raises, in one tree.

    VmschedError
    ├── InvalidRequest
    │   ├── InvalidQuery          (also a ValueError)
    │   ├── DecisionNotFound
    │   └── RequestTooLarge       (the HTTP API: a body over VMSCHED_API_MAX_BODY_BYTES)
    ├── SchedulingError           (it becomes a decision with status error)
    │   ├── UnknownCluster
    │   ├── UnknownPolicyUnit
    │   ├── UnitsUnavailable  (retryable: no running worker has every unit of the policy)
    │   ├── InvalidProperty
    │   │   └── PropertyTooLong   (its code stays "invalid_property": on the wire it is one)
    │   ├── StaleState
    │   ├── DecisionLost
    │   └── PolicyError           (vmsched.db.PolicyRepository)
    │       ├── PolicyNotFound
    │       ├── PolicyLocked
    │       ├── PolicyInUse
    │       ├── PolicyExists
    │       └── InvalidPolicy
    ├── UnsupportedRegex          (also a ValueError)
    ├── StateConflict
    ├── InjectionError            (also a RuntimeError)
    ├── MigrationError
    ├── NotAuthorized             (the broker-vouched identity may not do this)
    ├── NotAuthenticated          (the HTTP API: no token, or one it does not know)
    ├── ServerUnavailable         (retryable: a server a service needs is away)
    │   ├── RedisUnavailable
    │   └── DatabaseUnavailable
    │       ├── PolicyStoreUnavailable
    │       └── DatabaseMissing   (not retryable: the database must be created)
    ├── BusError
    │   ├── RpcTimeout
    │   ├── NoConsumer
    │   ├── BusUnavailable
    │   └── RemoteError
    ├── LockError
    │   ├── LockTimeout
    │   └── FencedOut
    ├── StateResyncing            (retryable)
    │   └── GenerationLost
    └── CommandError
        ├── NotFound
        └── UsageError
    SettingsFileError             (also a ValueError)

Each carries a stable `code` (the `code` of the ErrorReply / ErrorInfo it becomes on the wire) and,
where it defines its own code, a `meaning`: one line saying what that code means, which
contracts/asyncapi.json lists under x-vmsched-error-codes.
"""

from __future__ import annotations

from typing import ClassVar, Literal

#: Why a connection to a server failed (the `kind` of ServerUnavailable and BusUnavailable): "away" (no
#: answer in time, the connection dropped, the server starting or stopping), "no_server" (nothing listens
#: at the address), "login_refused" (user or password), "permission_refused" (a user without rights on a
#: virtual host, database or command), "tls_refused" (the TLS handshake or a certificate check failed),
#: "wrong_server" (another kind of server answers at the address). The last four do not pass by waiting:
#: someone must change a setting, a certificate or a user's rights (`needs_action`).
ConnectionFailure = Literal["away", "no_server", "login_refused", "permission_refused", "tls_refused", "wrong_server"]
#: The kinds a process does not start with (it would only retry what cannot succeed).
NEEDS_ACTION: frozenset[ConnectionFailure] = frozenset(
    {"login_refused", "permission_refused", "tls_refused", "wrong_server"}
)


class VmschedError(Exception):
    code = "internal"
    #: Whether the same request may simply be sent again later (the failure is not its fault).
    retryable: ClassVar[bool] = False
    # "internal" is what the bus answers for an exception that is none of these, so its meaning says that.
    meaning: ClassVar[str] = (
        "an unexpected error in the service: the message carries only a reference id, which names the full "
        "error in that service's log"
    )

    def __init__(self, message: str, *, location: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        # Validation messages already name every location; do not say the first one twice.
        if self.location and self.location not in self.message:
            return f"{self.location}: {self.message}"
        return self.message


class InvalidRequest(VmschedError):
    code = "invalid_request"
    meaning = "bad input: what was wrong and where (`location`, a JSON path)"


class InvalidQuery(InvalidRequest, ValueError):
    """A JsonFilter query the grammar cannot evaluate (unknown operator, nested too deep).

    Also a ValueError, as it was before it joined this tree: `check_query` and `query_passes` are
    public, and a caller that catches a malformed query as ValueError must keep catching it.
    """

    code = "invalid_query"
    meaning = "a Nova JsonFilter query the grammar cannot evaluate"


class DecisionNotFound(InvalidRequest):
    """RPC `decisions.get` for a request id with no stored decision."""

    code = "decision_not_found"
    meaning = (
        "no decision is stored for that request id: it was never decided, was not stored (errors and expired "
        "requests are not), or is older than VMSCHED_DECISION_TTL_S"
    )


class RequestTooLarge(InvalidRequest):
    """An HTTP request body larger than VMSCHED_API_MAX_BODY_BYTES: refused before it is read whole."""

    code = "request_too_large"
    meaning = "the HTTP request's body is larger than VMSCHED_API_MAX_BODY_BYTES; nothing of it was parsed"


class SchedulingError(VmschedError):
    code = "scheduling_error"
    meaning = "a request that cannot be evaluated (it becomes a decision with status error)"


class UnknownCluster(SchedulingError):
    code = "unknown_cluster"
    meaning = "no state has ever been reported for the cluster"


class UnknownPolicyUnit(SchedulingError):
    code = "unknown_policy_unit"
    meaning = "a policy names a unit the registry does not have"


class UnitsUnavailable(SchedulingError):
    """No running worker has every unit a policy names (its plugin is installed where none of them
    runs), or the worker a request reached lacks some: the message names the units and the instances
    lacking them. Retryable: a worker with the plugin may start, and the selector sends only to those."""

    code = "units_unavailable"
    retryable = True
    meaning = (
        "retryable: no running worker has every unit the policy names: the message names the missing units and "
        "the service instances lacking them (install the plugin there, or start a worker that has it)"
    )


class InvalidProperty(SchedulingError):
    code = "invalid_property"
    meaning = "a custom property value does not match the unit's regex"

    def __init__(self, unit: str, prop: str, value: str, regex: str) -> None:
        super().__init__(
            f"property {prop}={value!r} of unit {unit} does not match {regex!r}",
            location=f"properties.{prop}",
        )
        self.unit, self.prop, self.value, self.regex = unit, prop, value, regex


class PropertyTooLong(InvalidProperty):
    """A property value longer than `limit` characters: refused before its regex runs.

    Its code is InvalidProperty's: callers see an invalid property either way; the message says why.
    """

    def __init__(self, unit: str, prop: str, value: str, regex: str, limit: int) -> None:
        SchedulingError.__init__(
            self,
            f"property {prop} of unit {unit} is {len(value)} characters long; the limit is {limit} "
            f"(starts {value[:40]!r})",
            location=f"properties.{prop}",
        )
        self.unit, self.prop, self.value, self.regex = unit, prop, value, regex


class StaleState(SchedulingError):
    code = "stale_state"
    meaning = "a worker cannot reach the state version a request was made against"


class PolicyError(SchedulingError):
    code = "policy_error"
    meaning = "administering policies (vmsched.db.PolicyRepository)"


class PolicyNotFound(PolicyError):
    code = "policy_not_found"
    meaning = "no policy with that id or name"


class PolicyLocked(PolicyError):
    code = "policy_locked"
    meaning = "a built-in policy cannot be edited or deleted: clone it"


class PolicyInUse(PolicyError):
    code = "policy_in_use"
    meaning = "still attached to clusters, or the default"


class PolicyExists(PolicyError):
    code = "policy_exists"
    meaning = "a policy with that name or id exists"


class InvalidPolicy(PolicyError):
    """A policy or cluster attachment that does not validate; the message lists every problem."""

    code = "invalid_policy"
    meaning = "a policy or attachment does not validate: every problem, each with a fix"


class UnsupportedRegex(VmschedError, ValueError):
    """The regex uses a construct the backtracking check cannot reason about (backreference, lookaround).

    Also a ValueError, as it was before it joined this tree: a unit that declares such a regex fails
    at definition (PropertySpec) exactly like one whose regex may backtrack, which is a ValueError.
    """

    code = "unsupported_regex"
    meaning = "a unit's property regex uses a construct the backtracking check cannot judge (backreference, lookaround)"


class StateConflict(VmschedError):
    """The cluster's state in Redis moved on under the writer twice in a row (another writer?)."""

    code = "state_conflict"
    meaning = "the cluster's state in Redis moved on under a writer twice in a row"


class InjectionError(VmschedError, RuntimeError):
    """A fault could not be injected (the tool is missing or refused): the experiment is void.

    Also a RuntimeError, as it was before it joined this tree, so handlers written for it keep working.
    """

    code = "injection_error"
    meaning = "the fault suite could not inject a fault: the experiment is void"


class MigrationError(VmschedError):
    code = "migration_error"
    meaning = "a database migration cannot be applied (e.g. an applied file changed)"


class NotAuthorized(VmschedError):
    """The message's sender, as the broker vouches for it (the AMQP user_id property, which RabbitMQ
    checks against the connection's user), may not do what it asked; or the message names no sender."""

    code = "not_authorized"
    meaning = (
        "the AMQP user that sent the request may not do this (administration needs a user named in "
        "VMSCHED_ADMIN_USERS); connect as one"
    )

    def __init__(self, message: str, *, location: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, location=location)
        #: What to do about it (the HTTP API answers it with the error).
        self.hint = hint


class NotAuthenticated(VmschedError):
    """An HTTP API request without a bearer token (or session cookie), or with one the tokens file
    (VMSCHED_API_TOKENS_FILE) does not hold."""

    code = "not_authenticated"
    meaning = (
        "the HTTP API request carries no token, or one VMSCHED_API_TOKENS_FILE does not hold: send "
        "`Authorization: Bearer <token>` (`vmsched api token add` makes one)"
    )

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        #: What to do about it.
        self.hint = hint


class _Unreached:
    """What ServerUnavailable and BusUnavailable add to an error: why the connection was not made
    (`kind`) and what to do (`hint`). Not an error of its own: a part of those two."""

    def __init__(
        self,
        message: str,
        *,
        location: str | None = None,
        kind: ConnectionFailure = "away",
        hint: str | None = None,
    ) -> None:
        super().__init__(message, location=location)  # type: ignore[call-arg]  # VmschedError's, next in the MRO
        #: What kept the connection from being made (ConnectionFailure).
        self.kind: ConnectionFailure = kind
        #: What to do about it, for the operator (the CLI prints it under the message).
        self.hint = hint

    @property
    def needs_action(self) -> bool:
        """Whether waiting cannot help: a setting, a certificate or a user's rights must change."""
        return self.kind in NEEDS_ACTION


class ServerUnavailable(_Unreached, VmschedError):
    """A server a service needs (Redis, PostgreSQL) cannot be reached now.

    The bus's dispatcher treats it as transient: the message is tried again (VMSCHED_TRANSIENT_ATTEMPTS),
    and a request still failing then is answered with this error's code, which says to send it again.
    The store and db layers translate their drivers' connection errors into it (`unavailable` in
    vmsched.store.redis and vmsched.db.pool), so the bus never has to know those drivers.
    """

    code = "server_unavailable"
    meaning = "retryable: a server the service needs cannot be reached right now; send the request again later"
    #: Another attempt may succeed (the server comes back by itself); False where someone must act first.
    retryable: ClassVar[bool] = True


class RedisUnavailable(ServerUnavailable):
    code = "redis_unavailable"
    meaning = "retryable: the service cannot reach Redis right now (it stops consuming until Redis is back)"


class DatabaseUnavailable(ServerUnavailable):
    code = "database_unavailable"
    meaning = "retryable: PostgreSQL cannot be reached"


class PolicyStoreUnavailable(DatabaseUnavailable):
    code = "policy_store_unavailable"
    meaning = (
        "retryable: PostgreSQL, which keeps the policies, cannot be reached and the service has no policy "
        "cached for the cluster (or policy administration cannot read or write); send it again once it is back"
    )


class DatabaseMissing(DatabaseUnavailable):
    code = "database_missing"
    meaning = "the server answers, but the database does not exist (`vmsched db migrate`)"
    retryable = False


class BusError(VmschedError):
    code = "bus_error"
    meaning = "talking to RabbitMQ"


class RpcTimeout(BusError):
    code = "rpc_timeout"
    meaning = "no reply within the call's timeout (publish, queueing and work included)"


class NoConsumer(BusError):
    code = "no_consumer"
    meaning = "the request was returned unroutable, or no service consumes its queue"


class BusUnavailable(_Unreached, BusError):
    code = "bus_unavailable"
    meaning = "RabbitMQ cannot be reached right now (the bus reconnects by itself)"


class RemoteError(BusError):
    code = "remote_error"
    meaning = "the service answered with an ErrorReply (`code`, `message`, `location`)"

    def __init__(self, code: str, message: str, *, location: str | None = None) -> None:
        super().__init__(message, location=location)
        self.remote_code = code


class LockError(VmschedError):
    code = "lock_error"
    meaning = "the per-cluster lock"


class LockTimeout(LockError):
    code = "lock_timeout"
    meaning = "not acquired within the acquire timeout"


class FencedOut(LockError):
    code = "fenced_out"
    meaning = "a write carried a fencing token older than the lock's latest"


class StateResyncing(VmschedError):
    """Retryable: the cluster waits for the engine's full report after Redis lost its state."""

    code = "state_resyncing"
    retryable = True
    meaning = (
        "retryable: Redis lost the cluster's state; it is not scheduled until the engine has re-reported it in "
        "full (state.resync-requested) — retry the same request id after that"
    )


class GenerationLost(StateResyncing):
    """Redis no longer holds a cluster's generation marker: it forgot (or another server answers).
    Its code stays "state_resyncing": on the wire it is one (the engine acts on both alike).

    Raised by the store where a script finds it; whoever catches it starts a new generation
    (vmsched.recovery) and the request is answered `state_resyncing`."""

    def __init__(self, message: str, *, location: str | None = None, cluster_id: str) -> None:
        super().__init__(message, location=location)
        self.cluster_id = cluster_id


class DecisionLost(SchedulingError):
    code = "decision_lost"
    meaning = (
        "not retryable with the same id: Redis lost the decisions made before a failure, and the engine reports "
        "this request's VM already on a host, so it is not placed a second time; send a new request id to place "
        "it anyway"
    )


class CommandError(VmschedError):
    """A `vmsched` command's own refusal: said to its user as it is, with what to do in `hint`."""

    code = "command_error"
    meaning = "a `vmsched` command cannot do what it was asked (`hint`: what to do)"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class NotFound(CommandError):
    code = "not_found"
    meaning = "what it was told to act on does not exist, or it was told not to"


class UsageError(CommandError):
    code = "usage_error"
    meaning = "its input is wrong (an option, a file, a setting)"


class SettingsFileError(VmschedError, ValueError):
    """A VMSCHED_<NAME>_FILE that cannot be used: the message names the variable and the path, never
    what the file holds. Also a ValueError, as pydantic-settings' own refusals are."""

    code = "settings_file"
    meaning = "a VMSCHED_<NAME>_FILE cannot be read, or is set beside VMSCHED_<NAME>"


__all__ = [
    "BusError",
    "BusUnavailable",
    "CommandError",
    "DatabaseMissing",
    "DatabaseUnavailable",
    "DecisionLost",
    "DecisionNotFound",
    "FencedOut",
    "GenerationLost",
    "InjectionError",
    "InvalidPolicy",
    "InvalidProperty",
    "InvalidQuery",
    "InvalidRequest",
    "LockError",
    "LockTimeout",
    "MigrationError",
    "NoConsumer",
    "NotAuthenticated",
    "NotAuthorized",
    "NotFound",
    "PolicyError",
    "PolicyExists",
    "PolicyInUse",
    "PolicyLocked",
    "PolicyNotFound",
    "PolicyStoreUnavailable",
    "PropertyTooLong",
    "RedisUnavailable",
    "RemoteError",
    "RequestTooLarge",
    "RpcTimeout",
    "SchedulingError",
    "ServerUnavailable",
    "SettingsFileError",
    "StaleState",
    "StateConflict",
    "StateResyncing",
    "UnitsUnavailable",
    "UnknownCluster",
    "UnknownPolicyUnit",
    "UnsupportedRegex",
    "UsageError",
    "VmschedError",
]
