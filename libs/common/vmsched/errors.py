"""Every exception vmsched raises, in one tree.

    VmschedError
    ├── InvalidRequest            bad input: what was wrong and where (`location`, a JSON path)
    │   └── InvalidQuery          a Nova JsonFilter query the grammar cannot evaluate (also a ValueError)
    ├── SchedulingError           a request that cannot be evaluated (it becomes a decision with status error)
    │   ├── UnknownCluster        no state has ever been reported for the cluster
    │   ├── UnknownPolicyUnit     a policy names a unit the registry does not have
    │   ├── InvalidProperty       a custom property value does not match the unit's regex
    │   │   └── PropertyTooLong   a value over the length limit, refused before its regex runs
    │   │                         (its code stays "invalid_property": on the wire it is one)
    │   ├── StaleState            a worker cannot reach the state version a request was made against
    │   └── PolicyError           administering policies (vmsched.db.PolicyRepository)
    │       ├── PolicyNotFound    no policy with that id or name
    │       ├── PolicyLocked      a built-in policy cannot be edited or deleted: clone it
    │       ├── PolicyInUse       still attached to clusters, or the default
    │       ├── PolicyExists      a policy with that name or id exists
    │       └── InvalidPolicy     a policy or attachment does not validate: every problem, each with a fix
    ├── UnsupportedRegex          a unit's property regex uses a construct the backtracking check cannot
    │                             judge (backreference, lookaround) (also a ValueError)
    ├── StateConflict             the cluster's state in Redis moved on under a writer twice in a row
    ├── InjectionError            the fault suite could not inject a fault: the experiment is void
    │                             (also a RuntimeError)
    ├── MigrationError            a database migration cannot be applied (e.g. an applied file changed)
    ├── DatabaseUnavailable       PostgreSQL cannot be reached
    │   └── DatabaseMissing       the server answers, but the database does not exist (`vmsched db migrate`)
    ├── BusError                  talking to RabbitMQ
    │   ├── RpcTimeout            no reply within the call's timeout (publish, queueing and work included)
    │   ├── NoConsumer            the request was returned unroutable, or no service consumes its queue
    │   ├── BusUnavailable        RabbitMQ cannot be reached right now (the bus reconnects by itself)
    │   └── RemoteError           the service answered with an ErrorReply (`code`, `message`, `location`)
    └── LockError                 the per-cluster lock
        ├── LockTimeout           not acquired within the acquire timeout
        └── FencedOut             a write carried a fencing token older than the lock's latest

Each carries a stable `code` (the `code` of the ErrorReply / ErrorInfo it becomes on the wire).
"""

from __future__ import annotations


class VmschedError(Exception):
    code = "internal"

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


class InvalidQuery(InvalidRequest, ValueError):
    """A JsonFilter query the grammar cannot evaluate (unknown operator, nested too deep).

    Also a ValueError, as it was before it joined this tree: `check_query` and `query_passes` are
    public, and a caller that catches a malformed query as ValueError must keep catching it.
    """

    code = "invalid_query"


class SchedulingError(VmschedError):
    code = "scheduling_error"


class UnknownCluster(SchedulingError):
    code = "unknown_cluster"


class UnknownPolicyUnit(SchedulingError):
    code = "unknown_policy_unit"


class InvalidProperty(SchedulingError):
    code = "invalid_property"

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


class PolicyError(SchedulingError):
    code = "policy_error"


class PolicyNotFound(PolicyError):
    code = "policy_not_found"


class PolicyLocked(PolicyError):
    code = "policy_locked"


class PolicyInUse(PolicyError):
    code = "policy_in_use"


class PolicyExists(PolicyError):
    code = "policy_exists"


class InvalidPolicy(PolicyError):
    """A policy or cluster attachment that does not validate; the message lists every problem."""

    code = "invalid_policy"


class UnsupportedRegex(VmschedError, ValueError):
    """The regex uses a construct the backtracking check cannot reason about (backreference, lookaround).

    Also a ValueError, as it was before it joined this tree: a unit that declares such a regex fails
    at definition (PropertySpec) exactly like one whose regex may backtrack, which is a ValueError.
    """

    code = "unsupported_regex"


class StateConflict(VmschedError):
    """The cluster's state in Redis moved on under the writer twice in a row (another writer?)."""

    code = "state_conflict"


class InjectionError(VmschedError, RuntimeError):
    """A fault could not be injected (the tool is missing or refused): the experiment is void.

    Also a RuntimeError, as it was before it joined this tree, so handlers written for it keep working.
    """

    code = "injection_error"


class MigrationError(VmschedError):
    code = "migration_error"


class DatabaseUnavailable(VmschedError):
    code = "database_unavailable"


class DatabaseMissing(DatabaseUnavailable):
    code = "database_missing"


class BusError(VmschedError):
    code = "bus_error"


class RpcTimeout(BusError):
    code = "rpc_timeout"


class NoConsumer(BusError):
    code = "no_consumer"


class BusUnavailable(BusError):
    code = "bus_unavailable"


class RemoteError(BusError):
    code = "remote_error"

    def __init__(self, code: str, message: str, *, location: str | None = None) -> None:
        super().__init__(message, location=location)
        self.remote_code = code


class LockError(VmschedError):
    code = "lock_error"


class LockTimeout(LockError):
    code = "lock_timeout"


class FencedOut(LockError):
    code = "fenced_out"


__all__ = [
    "BusError",
    "BusUnavailable",
    "DatabaseMissing",
    "DatabaseUnavailable",
    "FencedOut",
    "InjectionError",
    "InvalidPolicy",
    "InvalidProperty",
    "InvalidQuery",
    "InvalidRequest",
    "LockError",
    "LockTimeout",
    "MigrationError",
    "NoConsumer",
    "PolicyError",
    "PolicyExists",
    "PolicyInUse",
    "PolicyLocked",
    "PolicyNotFound",
    "PropertyTooLong",
    "RemoteError",
    "RpcTimeout",
    "SchedulingError",
    "StaleState",
    "StateConflict",
    "UnknownCluster",
    "UnknownPolicyUnit",
    "UnsupportedRegex",
    "VmschedError",
]
