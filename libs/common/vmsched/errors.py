"""Every exception vmsched raises, in one tree.

    VmschedError
    ├── InvalidRequest            bad input: what was wrong and where (`location`, a JSON path)
    ├── SchedulingError           a request that cannot be evaluated (it becomes a decision with status error)
    │   ├── UnknownCluster        no state has ever been reported for the cluster
    │   ├── UnknownPolicyUnit     a policy names a unit the registry does not have
    │   ├── InvalidProperty       a custom property value does not match the unit's regex
    │   ├── StaleState            a worker cannot reach the state version a request was made against
    │   └── PolicyError           administering policies (vmsched.db.PolicyRepository)
    │       ├── PolicyNotFound    no policy with that id or name
    │       ├── PolicyLocked      a built-in policy cannot be edited or deleted: clone it
    │       ├── PolicyInUse       still attached to clusters, or the default
    │       └── PolicyExists      a policy with that name or id exists
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
    "InvalidProperty",
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
    "RemoteError",
    "RpcTimeout",
    "SchedulingError",
    "StaleState",
    "UnknownCluster",
    "UnknownPolicyUnit",
    "VmschedError",
]
