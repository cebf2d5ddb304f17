"""The `vmsched` command.

vmsched up                         all services in this process (development)
vmsched run SERVICE                one service: state-tracker, filter-worker, weigher, selector,
                                   balancer, ha-monitor, policy-admin, api
vmsched schedule --cluster C --vm vm.json
vmsched explain REQUEST_ID --cluster C  a decision's full table (filters and weights per host)
vmsched watch [--cluster C]        decisions, migrations, power advice and HA alerts, live
vmsched state --cluster C          what the state tracker knows
vmsched decisions --cluster C      the cluster's recent decisions, newest first
vmsched ha-check --cluster C       the HA reservation check, now
vmsched dead-letters list|show|requeue
                                   refused messages: why, and sending them again
vmsched clusters list|remove       clusters with state; taking one out
vmsched hosts remove --cluster C HOST ...
vmsched audit [--actor U] [--action A] [--limit N]
                                   who changed policies, removed clusters or hosts, requeued dead letters
vmsched db migrate                 create/upgrade the PostgreSQL schema, seed built-in policies
vmsched contracts [--check]        (re)generate contracts/ from the message models
vmsched units list                 the policy-unit catalogue
vmsched policy list|show|export|apply -f FILE|clone|delete|attach|detach|history|rollback|import-nova
                                   administer policies (the policy-admin service), from files in git
vmsched security init|print|apply  credentials per role; RabbitMQ, Redis and PostgreSQL definitions
vmsched api token add NAME --role R [--file F]
                                   a bearer token for the HTTP API (printed once; the file keeps its hash)
vmsched demo [--json]              a simulated datacenter, end to end
vmsched bench [--json-out FILE]    decision latency and throughput, with and without the bus
vmsched simulate [--workload FILE | --scenario NAME | --generate] --policy P [--policy Q ...] [--over-bus]
                                   replay a workload against policies on a simulated clock
vmsched chaos [EXPERIMENT ...] [--long] [--json]
                                   the fault suite against the configured servers

Each command group is a module of its own with its `cmd_NAME(args) -> exit code` functions and an
`add_commands(sub)` that makes their parsers (clikit.command): service_cli (run, up), engine_cli
(schedule, explain, watch, state), ops_cli with ops (decisions, ha-check, dead-letters, clusters,
hosts), audit_cli, db_cli, contracts_cli, units_cli, policy_cli, security_cli, api_cli and tool_cli
(demo, bench, simulate, chaos).
This module assembles them into one parser and holds the error boundary, `main`. A new command
goes into the group it belongs to. Each command imports what it runs inside its function:
`vmsched --help` and the light commands then start without loading what the commands run.

Errors: a command raises (vmsched.errors.CommandError for what it finds wrong, or the library's own errors) and
`main` is the one place that turns any failure into a sentence, a hint and an exit code
(tools/failures.py); only an unexpected error shows a traceback, and only with --debug.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import traceback
from collections.abc import Sequence

from vmsched_services.tools import (
    api_cli,
    audit_cli,
    contracts_cli,
    db_cli,
    engine_cli,
    ops_cli,
    policy_cli,
    security_cli,
    service_cli,
    tool_cli,
    units_cli,
)
from vmsched_services.tools.clikit import (
    DEBUG_ENV,
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNPLACEABLE,
    EXIT_USAGE,
    HelpFormatter,
    debug_requested,
)
from vmsched_services.tools.failures import explain_failure, masked, print_error, report_unexpected, stdout_gone

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNPLACEABLE",
    "EXIT_USAGE",
    "build_parser",
    "explain_failure",
    "main",
]


# ---------------------------------------------------------------- the parser
def _epilog() -> str:
    from vmsched.settings import Settings

    defaults = {name: f.default for name, f in Settings.model_fields.items()}
    return f"""\
exit codes:
  {EXIT_OK:<4} done; `schedule`: the VM was placed
  {EXIT_UNPLACEABLE:<4} `schedule`: no host can take the VM; other commands: nothing found, or the check failed
  {EXIT_USAGE:<4} usage mistake: bad options, a missing or invalid input file, a bad id or setting
  {EXIT_ERROR:<4} error: a server is down, a request was refused, a service did not answer
  {EXIT_INTERRUPTED:<4} interrupted (Ctrl-C)
  {EXIT_BROKEN_PIPE:<4} the reader of the output went away (`vmsched watch | head`)

environment (every setting is VMSCHED_<NAME>; see libs/common/vmsched/settings.py):
  VMSCHED_AMQP_URL      RabbitMQ (default {defaults["amqp_url"]})
  VMSCHED_REDIS_URL     Redis (default {defaults["redis_url"]})
  VMSCHED_POSTGRES_URL  PostgreSQL (default {defaults["postgres_url"]})
  VMSCHED_AMQP_PREFIX   prefix of the exchanges and queues of one deployment (default none)
  VMSCHED_REDIS_PREFIX  prefix of the Redis keys of one deployment (default {defaults["redis_prefix"]})
  {DEBUG_ENV}=1       tracebacks of unexpected errors, as --debug
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vmsched",
        description="VM scheduler services and tools.",
        epilog=_epilog(),
        formatter_class=HelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"vmsched {_version()}", help="print the version and exit")
    p.add_argument(
        "--debug",
        action="store_true",
        help=f"print the traceback of an unexpected error (or set ${DEBUG_ENV}=1)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    service_cli.add_commands(sub)
    engine_cli.add_commands(sub)
    ops_cli.add_commands(sub)
    audit_cli.add_commands(sub)
    db_cli.add_commands(sub)
    contracts_cli.add_commands(sub)
    units_cli.add_commands(sub)
    policy_cli.add_commands(sub)
    security_cli.add_commands(sub)
    api_cli.add_commands(sub)
    tool_cli.add_commands(sub)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vmsched")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown (not installed)"


# ---------------------------------------------------------------- the error boundary
def interrupted() -> int:
    """Ctrl-C: one line and EXIT_INTERRUPTED, however many times it was pressed. A second Ctrl-C
    lands in asyncio.run's cleanup (closing connections): the task it stops is logged by asyncio, with
    a traceback, when it is collected at exit; and a third would land in this handler. So: further
    Ctrl-Cs are ignored while the process ends, and asyncio's leftovers are not logged."""
    with contextlib.suppress(ValueError):  # not the main thread: nothing to ignore there
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
    print_error("vmsched: interrupted")
    return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = bool(getattr(args, "debug", False)) or debug_requested()
    if args.command not in ("run", "up"):  # services configure their own logs (level, format)
        from vmsched.logging import configure

        # A tool's output is for a human: warnings on one line each. The AMQP client's own
        # connection messages are left out: the bus turns them into one BusUnavailable sentence.
        configure("WARNING", "console")
        for noisy in ("aiormq", "aio_pika"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        return int(args.fn(args))
    except KeyboardInterrupt:
        return interrupted()
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        return interrupted()
    except BrokenPipeError:
        stdout_gone()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        return _failed(exc, args, debug)


def _failed(exc: Exception, args: argparse.Namespace, debug: bool) -> int:
    """A command's failure, told: its sentence and hint (or a bug's reference), and its exit code."""
    cluster = getattr(args, "cluster", None)
    # `schedule`'s 1 says no host can take the VM: an unknown cluster must not read as that.
    missing = EXIT_ERROR if args.command == "schedule" else EXIT_NOT_FOUND
    failure = explain_failure(exc, getattr(args, "needs", None), cluster if cluster != "*" else None, missing=missing)
    if failure is None:
        report_unexpected(exc, debug)
        return EXIT_ERROR
    print_error(f"vmsched: {failure.message}")
    if failure.hint:
        print_error(f"  {failure.hint}")
    if debug:
        print(masked("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
    return failure.code


if __name__ == "__main__":
    sys.exit(main())
