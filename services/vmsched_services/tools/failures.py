"""How `vmsched` tells its user what went wrong: a sentence, a hint of what to do, an exit code.

`explain_failure` maps every failure a command can meet to a `Failure` (cli.main prints it): the
command's own CommandError, the library's VmschedError tree (with the server or service to start), the
server drivers' exceptions where the library let one through, file and validation errors. What it
cannot explain is a bug: `report_unexpected` prints one line with a reference and keeps the
traceback in a file of that name.
"""

from __future__ import annotations

import os
import sys
import tempfile
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

from vmsched.errors import (
    BusUnavailable,
    DatabaseMissing,
    DatabaseUnavailable,
    NoConsumer,
    RemoteError,
    RpcTimeout,
    ServerUnavailable,
    VmschedError,
)
from vmsched_services.tools.clikit import (
    DEBUG_ENV,
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CommandError,
    exit_code,
    redacted,
    settings,
)

#: How to start each server, for the hint when one does not answer (scripts/servers.sh does the same).
START_HINTS = {
    "RabbitMQ": "to start it: `rabbitmq-server -detached` (Debian package rabbitmq-server), or "
    "`docker compose -f deploy/compose.yml up -d rabbitmq`; in a checkout, `scripts/servers.sh` starts "
    "all three servers",
    "Redis": "to start it: `redis-server --daemonize yes` (Debian package redis-server), or "
    "`docker compose -f deploy/compose.yml up -d redis`; in a checkout, `scripts/servers.sh` starts all "
    "three servers. $VMSCHED_REDIS_URL says where it is",
    "PostgreSQL": "to start it: `pg_ctlcluster <version> main start` (Debian package postgresql), or "
    "`docker compose -f deploy/compose.yml up -d postgres`; in a checkout, `scripts/servers.sh` starts all "
    "three servers",
}


#: What a service answers when what a command named does not exist. A command ends with EXIT_NOT_FOUND
#: for it, whichever service answered (the state tracker, the HA monitor, policy-admin), as for what
#: the command itself finds missing; `schedule` alone ends with EXIT_ERROR, its 1 meaning "no host
#: can take the VM", which a script must not take an unknown cluster for.
NOT_FOUND_CODES = frozenset({"unknown_cluster", "policy_not_found"})


@dataclass(frozen=True)
class Failure:
    """What the user is told instead of a traceback."""

    message: str
    hint: str | None
    code: int


def remote_failure(code: str, message: str, cluster: str | None) -> tuple[str, str | None]:
    """An error a service answered with (its ErrorReply code and text), said for an operator, and
    what to do about it."""
    if code == "unknown_cluster" and cluster:
        message = f"cluster {cluster} is unknown: no state has been reported for it"
    return f"{code}: {message}", remote_hint(code)


def remote_hint(code: str) -> str | None:
    """What to do about an error a service answered with (its ErrorReply code)."""
    hints = {
        "unknown_cluster": "check the id: `vmsched clusters list` shows the clusters with state; a new cluster "
        "is known once the engine reports its hosts",
        "policy_not_found": "check the name: `vmsched policy list` shows the policies",
        "stale_state": "the cluster's state moved on while the request was handled: send it again",
        "lock_timeout": "the cluster is busy (its lock was held by other requests): send it again, or raise "
        "$VMSCHED_LOCK_ACQUIRE_TIMEOUT_S",
        "internal": "the service logged the details under the reference above",
        "redis_unavailable": "the service cannot reach Redis; it stops taking requests until Redis answers "
        "(`/readyz` says so). Send it again once Redis is back: " + START_HINTS["Redis"],
        "policy_store_unavailable": "PostgreSQL, which keeps the policies, is away; services keep deciding "
        "with the policies they read last, but nothing can be read or changed until it is back. "
        + START_HINTS["PostgreSQL"],
        "database_unavailable": START_HINTS["PostgreSQL"],
        "server_unavailable": "a server the service needs is away (its log and `/readyz` say which): "
        "send it again once it is back",
        "units_unavailable": "install the plugin providing those units where the instances named run (or start "
        "a worker that has it; `vmsched units list` shows each instance's units), then send it again",
        "not_authorized": "connect as an administrator: point VMSCHED_AMQP_URL at a RabbitMQ user named in the "
        "services' VMSCHED_ADMIN_USERS (`vmsched audit` shows who did what)",
    }
    if code in hints:
        return hints[code]
    if code.startswith("invalid_") or code.startswith("unknown_policy"):
        return "fix the field named above and send it again"
    return None


def _no_consumer_hint(needs: str | None) -> str:
    if needs:
        return f"start the {needs} (`vmsched run {needs}`, or every service with `vmsched up`)"
    return "start the services (`vmsched up`, or `vmsched run SERVICE` for each)"


def _explain_vmsched_error(exc: Exception, needs: str | None, cluster: str | None, missing: int) -> Failure | None:
    if isinstance(exc, RemoteError):
        code = missing if exc.remote_code in NOT_FOUND_CODES else EXIT_ERROR
        return Failure(*remote_failure(exc.remote_code, str(exc), cluster), code)
    if not isinstance(exc, VmschedError):
        return None
    hint: str | None = None
    if isinstance(exc, NoConsumer):
        hint = _no_consumer_hint(needs)
    elif isinstance(exc, RpcTimeout):
        hint = f"is the {needs or 'service'} overloaded or stuck? Its log says; --timeout waits longer"
    elif isinstance(exc, BusUnavailable | ServerUnavailable) and exc.needs_action and exc.hint:
        hint = exc.hint  # a refusal, TLS, another server, nothing there: its own advice, not "start it"
    elif isinstance(exc, BusUnavailable):
        hint = START_HINTS["RabbitMQ"]
    elif isinstance(exc, DatabaseMissing):
        hint = "`vmsched db migrate` creates it"
    elif isinstance(exc, DatabaseUnavailable):
        hint = START_HINTS["PostgreSQL"]
    return Failure(f"{exc.code}: {exc}", hint, EXIT_ERROR)


def _explain_driver_error(exc: Exception) -> Failure | None:
    """The server drivers' own exceptions, where the library let one through. Only drivers already
    loaded are looked at: an exception cannot come from one that is not."""
    if "redis" in sys.modules:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        if isinstance(exc, RedisConnectionError | RedisTimeoutError):
            from vmsched.store.redis_failures import diagnose

            named = diagnose(settings(), exc)
            hint = named.hint if named.needs_action else START_HINTS["Redis"]
            return Failure(f"{named.code}: {named}", hint, EXIT_ERROR)
    if "asyncpg" in sys.modules:
        import asyncpg

        if isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError):
            url = redacted(settings().postgres_url)
            return Failure(f"PostgreSQL at {url}: {type(exc).__name__}: {exc}", None, EXIT_ERROR)
    return None


def explain_failure(
    exc: BaseException, needs: str | None = None, cluster: str | None = None, *, missing: int = EXIT_NOT_FOUND
) -> Failure | None:
    """What to tell a user instead of a traceback, and the exit code; None for a bug. `needs` is the
    service the command talks to, `cluster` the cluster it named (for the hints); `missing` the exit
    code of a service's not-found answer (NOT_FOUND_CODES)."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return explain_failure(exc.exceptions[0], needs, cluster, missing=missing)
    if isinstance(exc, CommandError):
        return Failure(exc.message, exc.hint, exit_code(exc))
    if not isinstance(exc, Exception):
        return None
    told = _explain_vmsched_error(exc, needs, cluster, missing) or _explain_driver_error(exc)
    if told is not None:
        return told
    if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError | PermissionError):
        return Failure(f"{exc.filename}: {exc.strerror}", None, EXIT_USAGE)
    if "pydantic" in sys.modules:
        from pydantic import ValidationError

        if isinstance(exc, ValidationError):
            return Failure(f"invalid {exc.title}: {validation_problems(exc)}", None, EXIT_USAGE)
    if isinstance(exc, ConnectionError | TimeoutError):
        return Failure(
            f"{type(exc).__name__}: {exc}",
            "a server did not answer: `scripts/servers.sh` (in a checkout) says which and starts it",
            EXIT_ERROR,
        )
    return None


def masked(text: str) -> str:
    """`text` without the process's secrets (vmsched.logging.SECRETS), for whatever a command prints
    or writes beside its output. Only once the registry is loaded: it is empty before (clikit.settings
    loads and fills it), and `vmsched --help` must not load structlog."""
    logging_module = sys.modules.get("vmsched.logging")
    return text if logging_module is None else str(logging_module.SECRETS.mask(text))


def print_error(text: str) -> None:
    """One message on stderr, secrets masked: every failure `vmsched` reports goes out through here."""
    print(masked(text), file=sys.stderr)


def report_unexpected(exc: BaseException, debug: bool) -> None:
    """One line with a reference, the traceback in a file named by it (and on stderr with --debug)."""
    ref = uuid.uuid4().hex[:8]
    where = None
    trace = masked("".join(traceback.format_exception(exc)))
    try:
        path = Path(tempfile.gettempdir()) / f"vmsched-error-{ref}.txt"
        path.write_text(trace)
        where = str(path)
    except OSError:
        pass
    print_error(f"vmsched: unexpected error (reference {ref}): {type(exc).__name__}: {exc}")
    if debug:
        print(trace, end="", file=sys.stderr)
    else:
        saved = f"the traceback is in {where}; " if where else ""
        print(f"  {saved}--debug (or {DEBUG_ENV}=1) prints it; please report it", file=sys.stderr)


def stdout_gone() -> None:
    """The reader left: point stdout at /dev/null so the interpreter's last flush does not fail too."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (captured in tests)
        pass


def validation_problems(exc: Exception, limit: int = 5) -> str:
    """A pydantic ValidationError as 'field.path: message; ...' (the first `limit`)."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    shown = [f"{'.'.join(str(p) for p in e['loc']) or '(the document)'}: {e['msg']}" for e in errors[:limit]]
    more = f"; and {len(errors) - limit} more" if len(errors) > limit else ""
    return "; ".join(shown) + more


__all__ = [
    "NOT_FOUND_CODES",
    "START_HINTS",
    "Failure",
    "explain_failure",
    "masked",
    "print_error",
    "remote_failure",
    "remote_hint",
    "report_unexpected",
    "stdout_gone",
    "validation_problems",
]
