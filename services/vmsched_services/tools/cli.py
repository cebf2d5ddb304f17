"""The `vmsched` command.

vmsched up                         all services in this process (development)
vmsched run SERVICE                one service: state-tracker, filter-worker, weigher, selector,
                                   balancer, ha-monitor, policy-admin
vmsched schedule --cluster C --vm vm.json
vmsched explain REQUEST_ID         a decision's full table (filters and weights per host)
vmsched watch [--cluster C]        decisions, migrations, power advice and HA alerts, live
vmsched state --cluster C          what the state tracker knows
vmsched decisions --cluster C      the cluster's recent decisions, newest first
vmsched ha-check --cluster C       the HA reservation check, now
vmsched dead-letters list|show|requeue
                                   refused messages: why, and sending them again
vmsched clusters list|remove       clusters with state; taking one out
vmsched hosts remove --cluster C HOST ...
vmsched db migrate                 create/upgrade the PostgreSQL schema, seed built-in policies
vmsched contracts [--check]        (re)generate contracts/ from the message models
vmsched units list                 the policy-unit catalogue
vmsched policy list|show|export|apply -f FILE|clone|delete|attach|detach|history|rollback|import-nova
                                   administer policies (the policy-admin service), from files in git
vmsched demo [--json]              a simulated datacenter, end to end
vmsched bench [--json-out FILE]    decision latency and throughput, with and without the bus
vmsched simulate [--workload FILE | --scenario NAME | --generate] --policy P [--policy Q ...] [--over-bus]
                                   replay a workload against policies on a simulated clock
vmsched chaos [EXPERIMENT ...] [--long] [--json]
                                   the fault suite against the configured servers

A new command is a `cmd_NAME(args) -> exit code` function (here, or in a module of its own such as
tools/ops.py) plus its parser, made with clikit.command, in the `_add_*_commands` group it belongs
to. Each command imports what it runs inside its function: `vmsched --help` and the light commands
then start in about half the time, without loading the services, NumPy or the drivers.

Errors: a command raises (vmsched.errors.CommandError for what it finds wrong, or the library's own errors) and
`main` is the one place that turns any failure into a sentence, a hint and an exit code
(tools/failures.py); only an unexpected error shows a traceback, and only with --debug.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vmsched_services.tools import ops
from vmsched_services.tools.clikit import (
    DEBUG_ENV,
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNPLACEABLE,
    EXIT_USAGE,
    CommandError,
    HelpFormatter,
    NotFound,
    SubParsers,
    UsageError,
    add_cluster,
    add_json,
    add_timeout,
    cluster_or_all,
    command,
    debug_requested,
    env_help,
    group,
    positive_int,
    request_id,
    seconds,
    settings,
    vmsched_id,
)
from vmsched_services.tools.failures import (
    explain_failure,
    remote_failure,
    report_unexpected,
    stdout_gone,
    validation_problems,
)
from vmsched_services.tools.policy_cli import add_commands as add_policy_commands

if TYPE_CHECKING:
    from vmsched.contracts import ScheduleDecision, VmSpec

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


# ---------------------------------------------------------------- services
def cmd_run(args: argparse.Namespace) -> int:
    from vmsched_services.runner import run

    asyncio.run(run([args.service], settings()))
    return EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    from vmsched_services import SERVICES
    from vmsched_services.runner import run

    asyncio.run(run(list(SERVICES), settings()))
    return EXIT_OK


# ---------------------------------------------------------------- engine commands
def read_vm(source: str) -> VmSpec:
    """The VM of `vmsched schedule --vm`: a file, or - for stdin. Each way it can be wrong is a
    UsageError naming the file and, for a VM that does not validate, the fields."""
    from pydantic import ValidationError

    from vmsched.contracts import VmSpec

    name = "stdin" if source == "-" else source
    raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()  # OSError: the boundary's
    try:
        json.loads(raw)
    except UnicodeDecodeError:
        raise UsageError(f"{name}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{name}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    try:
        return VmSpec.model_validate_json(raw)
    except ValidationError as exc:
        raise UsageError(
            f"{name}: not a valid VM: {validation_problems(exc)}",
            hint="the VM's fields are described in contracts/schemas/VmSpec.json",
        ) from None


def cmd_schedule(args: argparse.Namespace) -> int:
    from vmsched.client import SchedulerClient
    from vmsched.contracts import DecisionStatus
    from vmsched.explain import render_decision

    vm = read_vm(args.vm)

    async def go() -> ScheduleDecision:
        async with SchedulerClient(settings()) as client:
            return await client.schedule(
                args.cluster,
                vm,
                blacklist=args.exclude or (),
                max_alternates=args.alternates,
                explain_scores=args.scores,
                explain_hosts=args.hosts,
                timeout=args.timeout,
            )

    decision = asyncio.run(go())
    if args.json:
        print(decision.model_dump_json(indent=2))
    if decision.status is DecisionStatus.ERROR and decision.error is not None:
        message, hint = remote_failure(decision.error.code, decision.error.message, args.cluster)
        raise CommandError(message, hint=hint)
    if not args.json:
        print(render_decision(decision))
    if decision.status is DecisionStatus.PLACED:
        return EXIT_OK
    if decision.status is DecisionStatus.UNPLACEABLE:
        return EXIT_UNPLACEABLE
    return EXIT_ERROR  # expired: the deadline passed first


def cmd_explain(args: argparse.Namespace) -> int:
    from vmsched.explain import render_table
    from vmsched.store import DecisionStore
    from vmsched.store.redis import connect

    cfg = settings()

    async def go() -> ScheduleDecision | None:
        redis = connect(cfg)
        try:
            return await DecisionStore(redis, cfg).get(args.request_id)
        finally:
            await redis.aclose()

    decision = asyncio.run(go())
    if decision is None:
        raise NotFound(
            f"no decision stored for request {args.request_id}",
            hint="decisions are kept for $VMSCHED_DECISION_TTL_S; errors and expired requests are not stored; "
            "`vmsched decisions --cluster C` lists a cluster's recent ones",
        )
    print(decision.model_dump_json(indent=2) if args.json else render_table(decision, max_hosts=args.hosts))
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    from vmsched.client import SchedulerClient
    from vmsched.explain import render_event

    async def go() -> int:
        async with SchedulerClient(settings()) as client:
            print(f"watching {args.cluster} (Ctrl-C to stop)", file=sys.stderr)
            async for event in client.events(args.cluster):
                print(event.model_dump_json() if args.json else render_event(event), flush=True)
        return EXIT_OK

    return asyncio.run(go())


def cmd_state(args: argparse.Namespace) -> int:
    from vmsched.client import SchedulerClient

    async def go() -> int:
        async with SchedulerClient(settings()) as client:
            state = await client.state(args.cluster, timeout=args.timeout)
        if args.json:
            print(state.model_dump_json(indent=2))
            return EXIT_OK
        print(f"cluster {state.cluster_id} at version {state.version}: {len(state.hosts)} hosts, {len(state.vms)} VMs")
        for h in state.hosts:
            r = h.report
            print(
                f"  {r.host_id:<24} {r.status.value:<14} cpu {r.cpu_usage_pct:5.1f}% of {r.cpu_cores:>3} cores  "
                f"mem free {r.mem_free_mb:>8} / {r.physical_mem_mb:>8} MB  committed {h.mem_committed_mb:>8} MB  "
                f"vms {h.vm_count}"
            )
        return EXIT_OK

    return asyncio.run(go())


# ---------------------------------------------------------------- administration
def cmd_db_migrate(args: argparse.Namespace) -> int:
    from vmsched.db import migrate

    applied = asyncio.run(migrate(args.dsn or settings().postgres_url))
    print(f"applied {len(applied)} migration(s){': ' + ', '.join(applied) if applied else ''}; schema up to date")
    return EXIT_OK


def checkout_contracts(package_dir: Path) -> Path | None:
    """contracts/ of the checkout the package was installed from (pip install -e .), if it was:
    the package then lives at <checkout>/libs/common/vmsched."""
    common = package_dir.parent
    if common.name != "common" or common.parent.name != "libs":
        return None
    root = common.parent.parent
    return root / "contracts" if (root / "pyproject.toml").is_file() else None


def _contracts_root(out: str | None) -> Path:
    if out is not None:
        return Path(out)
    import vmsched

    package_dir = Path(vmsched.__file__).resolve().parent
    found = checkout_contracts(package_dir)
    if found is None:
        raise CommandError(
            f"no contracts/ directory next to the installed package ({package_dir}): vmsched is not installed "
            "from a checkout",
            hint="run it from a checkout (pip install -e .), or name the directory with --out DIR",
        )
    return found


def cmd_contracts(args: argparse.Namespace) -> int:
    from vmsched_services.tools.asyncapi import check, write

    root = _contracts_root(args.out)
    if args.check:
        if not root.is_dir():
            raise CommandError(
                f"{root} does not exist: there is nothing to check",
                hint="name the checkout's contracts/ directory with --out, or generate it with `vmsched contracts`",
            )
        problems = check(root)
        if problems:
            print(
                f"{root} is out of date with the message models: {', '.join(problems)}\n"
                "run `vmsched contracts` and commit the result",
                file=sys.stderr,
            )
            return EXIT_NOT_FOUND
        print(f"{root} matches the message models")
        return EXIT_OK
    changed = write(root)
    print(f"wrote {len(changed)} file(s) under {root}" + (": " + ", ".join(changed) if changed else ""))
    return EXIT_OK


def cmd_units_list(args: argparse.Namespace) -> int:
    """Every unit with its origin ("builtin" or a plugin's "<distribution> <version>"), then the
    plugins that were refused and why (with --json they are only logged, on stderr)."""
    from vmsched.scheduling.units import REGISTRY

    if args.json:
        print(
            json.dumps(
                [
                    {
                        "name": u.name,
                        "id": str(u.id),
                        "kinds": list(u.kinds),
                        "direction": u.direction.value,
                        "origin": u.origin,
                        "description": u.description,
                        "properties": {
                            k: {"regex": p.regex, "default": p.default, "description": p.description}
                            for k, p in u.properties.items()
                        },
                    }
                    for u in REGISTRY.values()
                ],
                indent=2,
            )
        )
        return EXIT_OK
    width = max(len("origin"), *(len(u.origin) for u in REGISTRY.values()))
    print(f"{'name':<36} {'kinds':<14} {'origin':<{width}} description")
    for u in sorted(REGISTRY.values(), key=lambda u: (u.kinds, u.name)):
        props = ", ".join(f"{k}={p.default}" if p.default is not None else k for k, p in u.properties.items())
        print(f"{u.name:<36} {'+'.join(u.kinds):<14} {u.origin:<{width}} {u.description}")
        if props:
            print(f"{'':<36} {'':<14} {'':<{width}} properties: {props}")
    if REGISTRY.refused:
        print(f"\nrefused plugins ({len(REGISTRY.refused)}), not loaded:")
        for r in REGISTRY.refused:
            print(f"  {r}")
    return EXIT_OK


# ---------------------------------------------------------------- tools
def cmd_demo(args: argparse.Namespace) -> int:
    from vmsched_services.tools.demo import main as demo_main

    return demo_main(args, settings())


def cmd_bench(args: argparse.Namespace) -> int:
    from vmsched_services.tools.bench import main as bench_main

    return bench_main(args, settings())


def hours(value: str) -> float:
    try:
        h = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of hours") from None
    if not 0 < h <= 24 * 366:
        raise argparse.ArgumentTypeError(f"{value} is not more than 0 hours and at most a year")
    return h


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.over_bus and not args.schema:
        from vmsched_services.tools.simulate_bus import main as over_bus_main

        return over_bus_main(args, settings())
    from vmsched_services.tools.simulate import main as simulate_main

    return simulate_main(args)


def cmd_chaos(args: argparse.Namespace) -> int:
    from vmsched.db import migrate
    from vmsched_services.tools.chaos import EXPERIMENTS
    from vmsched_services.tools.chaos.render import render_table

    unknown = [n for n in args.experiments if n not in EXPERIMENTS]
    if unknown:
        raise UsageError(f"unknown experiment(s) {', '.join(unknown)}; known: {', '.join(EXPERIMENTS)}")
    names = args.experiments or list(EXPERIMENTS)
    cfg = settings()
    log_root = Path(tempfile.mkdtemp(prefix="vmsched-chaos-"))

    async def go() -> list[dict[str, object]]:
        await migrate(cfg.postgres_url)  # the selector reads policies; idempotent
        results = []
        for name in names:
            if not args.json:
                print(f"running {name} ({'long' if args.long else 'short'}) ...", file=sys.stderr, flush=True)
            try:
                result = await EXPERIMENTS[name].run(cfg, log_root / name, long=args.long)
            except Exception as exc:  # an experiment that could not run is a result too, not a crash
                results.append({"experiment": name, "passed": False, "error": f"{type(exc).__name__}: {exc}"})
                continue
            if not args.json:
                print(result.summary(), file=sys.stderr, flush=True)
            results.append(result.as_dict())
        return results

    results = asyncio.run(go())
    if args.json:
        print(json.dumps({"logs": str(log_root), "results": results}, indent=2))
    else:
        print(render_table(results))
        print(f"service logs under {log_root}")
    return EXIT_OK if all(r["passed"] for r in results) else EXIT_NOT_FOUND


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
    _add_service_commands(sub)
    _add_engine_commands(sub)
    _add_operator_commands(sub)
    _add_admin_commands(sub)
    add_policy_commands(sub)
    _add_tool_commands(sub)
    return p


def _add_service_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    s = command(sub, "run", "run one service", cmd_run)
    from vmsched_services import SERVICES  # loaded with this package already

    s.add_argument("service", choices=list(SERVICES), help="the service to run")
    command(sub, "up", "run every service in this process (development)", cmd_up)


def _add_engine_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """What an engine does over the bus, from a shell."""
    s = command(sub, "schedule", "send one schedule request and print the decision", cmd_schedule, needs="selector")
    add_cluster(s)
    s.add_argument("--vm", required=True, metavar="FILE", help="a JSON file with the VM (a VmSpec), or - for stdin")
    s.add_argument("--exclude", action="append", type=vmsched_id, metavar="HOST", help="a host not to use (repeatable)")
    s.add_argument("--alternates", type=int, default=3, metavar="N", help="next-best hosts to return (default: 3)")
    s.add_argument("--scores", action="store_true", help="include the score table (vmsched explain shows it)")
    s.add_argument(
        "--hosts", action="store_true", help="list every removed host with its reason, even when the VM is placed"
    )
    add_timeout(s)
    add_json(s, "the decision")

    s = command(sub, "explain", "print a decision's full table: filters and weights per host", cmd_explain)
    s.add_argument("request_id", type=request_id, help="the request's id (a UUID)")
    s.add_argument("--hosts", type=int, default=8, metavar="N", help="host columns to show (0: all; default: 8)")
    add_json(s, "the stored decision")

    s = command(sub, "watch", "print decisions, migrations, power advice and HA alerts as they happen", cmd_watch)
    s.add_argument(
        "--cluster", default="*", type=cluster_or_all, metavar="C", help="one cluster, or * for all (default)"
    )
    add_json(s, "each event")

    s = command(sub, "state", "print a cluster's state as the state tracker has it", cmd_state, needs="state-tracker")
    add_cluster(s)
    add_timeout(s)
    add_json(s, "the state")


def _add_operator_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """What an operator looks at and repairs: decisions, HA, dead letters, clusters and hosts."""
    s = command(
        sub,
        "decisions",
        "a cluster's recent decisions, newest first (errors and expired requests are not stored)",
        ops.cmd_decisions,
    )
    add_cluster(s)
    s.add_argument(
        "--limit",
        type=positive_int,
        default=20,
        metavar="N",
        help="how many (default: 20; at most $VMSCHED_DECISION_HISTORY_MAX are kept per cluster)",
    )
    add_json(s, "the decisions")

    s = command(
        sub, "ha-check", "run the HA reservation check now; exit 1 if it fails", ops.cmd_ha_check, needs="ha-monitor"
    )
    add_cluster(s)
    add_timeout(s)
    add_json(s, "the report")

    _add_dead_letter_commands(sub)
    _add_cluster_commands(sub)


def _add_dead_letter_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    dl = group(sub, "dead-letters", "messages the services refused: list, show, send them again")
    s = command(dl, "list", "the dead letters, oldest first", ops.cmd_dead_letters_list)
    s.add_argument("--limit", type=positive_int, default=20, metavar="N", help="how many (default: 20)")
    add_json(s, "them")

    s = command(dl, "show", "one dead letter: why, where it was going, its body", ops.cmd_dead_letters_show)
    s.add_argument("target", metavar="N|ID", help="its number in `list` (1 is the oldest) or its id")
    add_json(s, "it")

    s = command(
        dl,
        "requeue",
        "publish dead letters again to where they were first published, and remove them from the queue",
        ops.cmd_dead_letters_requeue,
        description="Publish dead letters again to the exchange and routing key they were first published to, "
        "and remove them from the dead-letter queue. Only messages whose destination is known and whose body "
        "is whole are sent; the others stay, and the command says why.",
    )
    s.add_argument("targets", nargs="*", metavar="N|ID", help="numbers in `list` or ids")
    s.add_argument("--all", action="store_true", help="every dead letter that can be sent again")
    s.add_argument("--yes", action="store_true", help="do not ask before --all")


def _add_cluster_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    clusters = group(sub, "clusters", "the clusters vmsched holds state for")
    s = command(clusters, "list", "the clusters with state, one per line", ops.cmd_clusters_list)
    add_json(s, "the list")

    s = command(
        clusters,
        "remove",
        "take a cluster out: delete its state and pending resources (its policy link in PostgreSQL stays)",
        ops.cmd_clusters_remove,
        needs="state-tracker",
        description="Take a cluster out of vmsched: the state tracker deletes its state (hosts, VMs, settings) "
        "and pending resources, and the cluster is unknown until it reports again. Its policy link in "
        "PostgreSQL and its stored decisions (until they expire) are kept.",
    )
    s.add_argument("cluster", type=vmsched_id, help="the cluster's id")
    s.add_argument("--reason", default="", help="why, kept with the removal event")
    s.add_argument("--yes", action="store_true", help="do not ask first")
    _add_wait(s)
    add_timeout(s)

    hosts = group(sub, "hosts", "hosts of a cluster")
    s = command(
        hosts,
        "remove",
        "take hosts out of a cluster: drop them and the VMs counted on them (a host that reports again is back)",
        ops.cmd_hosts_remove,
        needs="state-tracker",
    )
    add_cluster(s)
    s.add_argument("hosts", nargs="+", type=vmsched_id, metavar="HOST", help="the hosts' ids")
    s.add_argument("--reason", default="", help="why, kept with the removal event")
    _add_wait(s)
    add_timeout(s)


def _add_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the state tracker to apply the removal (default: 10)",
    )


def _add_admin_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    db = group(sub, "db", "database commands")
    s = command(db, "migrate", "create the database if missing and apply migrations", cmd_db_migrate)
    s.add_argument("--dsn", default=None, metavar="URL", help=env_help("postgres_url", "the database"))

    s = command(sub, "contracts", "generate contracts/ from the message models", cmd_contracts)
    s.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="the contracts directory (default: contracts/ of the checkout vmsched is installed from)",
    )
    s.add_argument("--check", action="store_true", help="fail if the directory differs from the models")

    units = group(sub, "units", "policy units")
    s = command(units, "list", "the unit catalogue", cmd_units_list)
    add_json(s, "the catalogue")


def _add_tool_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """The demo, the bench, the simulator and the fault suite."""
    s = command(sub, "demo", "simulate a datacenter end to end over the bus", cmd_demo)
    add_json(s, "the summary")
    s.add_argument("--clusters", type=positive_int, default=3, metavar="N", help="clusters (default: 3)")
    s.add_argument("--hosts", type=positive_int, default=20, metavar="N", help="hosts per cluster (default: 20)")
    s.add_argument("--requests", type=positive_int, default=300, metavar="N", help="schedule requests (default: 300)")
    s.add_argument("--concurrency", type=positive_int, default=16, metavar="N", help="in flight at once (default: 16)")
    s.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    s.add_argument("--external", action="store_true", help="use services already running (vmsched up)")
    s.add_argument("--keep", action="store_true", help="keep the demo's clusters in Redis afterwards")

    s = command(sub, "bench", "measure decision latency and throughput", cmd_bench)
    s.add_argument(
        "--hosts",
        default="100,1000",
        help="hosts per cluster, comma-separated (default: 100,1000; 10000 works, reporting it takes a while)",
    )
    s.add_argument("--requests", type=positive_int, default=200, help="decisions per size over the bus (default: 200)")
    s.add_argument(
        "--concurrency", type=positive_int, default=32, help="requests in flight at once, one cluster (default: 32)"
    )
    s.add_argument(
        "--clusters",
        type=positive_int,
        default=10,
        help="also spread requests over N clusters (1: do not; default: 10)",
    )
    s.add_argument(
        "--spread-concurrency",
        type=positive_int,
        default=64,
        help="requests in flight at once over the --clusters clusters (default: 64)",
    )
    s.add_argument(
        "--json-out",
        default="bench-results/bench.json",
        metavar="FILE",
        help="where the results go (default: %(default)s)",
    )
    s.add_argument("--seed", type=int, default=11, help="random seed (default: 11)")

    s = command(
        sub,
        "simulate",
        "replay a workload against policies on a simulated clock",
        cmd_simulate,
        description="Replay a workload (a file, a built-in scenario, or a generated one) against each --policy "
        "in this process, with the selector's own placement function, and compare them side by side: hosts "
        "used against first-fit-decreasing, utilisation spread, placement failures and why, speed; a policy with "
        "a balance unit also balances (migrations per host per hour, spread by quarter, ping-pong). With --over-bus "
        "the real services decide instead (the configured VMSCHED_* servers; a service no process runs is started "
        "in this one): the state tracker is told the simulated cluster before each decision and the selector "
        "places each arrival and each migration's target. The balancing pass itself (which VM moves) stays in "
        "this process on the simulated clock. Slower, and the same decisions unless one depends on elapsed time "
        "(the services judge time by the wall clock: CPUOverloaded's overload duration); each policy is also "
        "replayed in process and the decisions that differ are listed.",
    )
    source = s.add_mutually_exclusive_group()
    source.add_argument("--workload", metavar="FILE", help="a workload file, YAML or JSON (docs/workload.schema.json)")
    source.add_argument(
        "--scenario", metavar="NAME", help="a built-in scenario: even-vm-count, ha-reservation, ha-reservation-balance"
    )
    source.add_argument("--generate", action="store_true", help="a generated workload (the default)")
    source.add_argument("--schema", action="store_true", help="print the workload file's JSON Schema and exit")
    s.add_argument("--hosts", type=positive_int, default=50, metavar="N", help="generated: hosts (default: 50)")
    s.add_argument("--vms", type=positive_int, default=1000, metavar="N", help="generated: VM arrivals (default: 1000)")
    s.add_argument("--hours", type=hours, default=24.0, metavar="H", help="generated: hours simulated (default: 24)")
    s.add_argument("--seed", type=int, default=1, help="generated: random seed (default: 1)")
    s.add_argument(
        "--ha-reservation",
        action="store_true",
        help="generated: the cluster keeps HA reservation (the HA check runs every 5 simulated minutes)",
    )
    s.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="P",
        help="a built-in policy's name, a policy file (vmsched policy format) or a policy the workload comes with; "
        "repeat to compare (default: the workload's policies, or none)",
    )
    s.add_argument(
        "--over-bus",
        action="store_true",
        help="decide through the real services (RabbitMQ, Redis, PostgreSQL as VMSCHED_* say; services not "
        "running are started in this process), on a cluster of its own removed at the end; balancing passes "
        "stay here, their targets are the selector's; compared with the in-process replay",
    )
    s.add_argument("--out", metavar="DIR", help="also write report.json (every sample) and workload.yaml here")
    s.add_argument(
        "--plot",
        metavar="DIR",
        help="also draw utilisation over time and per-host heat maps per policy: PNGs and index.html (all of "
        "them and the table in one page) here; needs matplotlib (pip install 'vmsched[plots]')",
    )
    add_json(s, "the numbers")

    s = command(sub, "chaos", "run the fault suite against the configured servers (own prefixes)", cmd_chaos)
    s.add_argument(
        "experiments", nargs="*", help="worker_kill | selector_kill | stale_holder | broker_drop | hostile_input"
    )
    s.add_argument(
        "--long",
        action="store_true",
        help="the full sizes (minutes); broker_drop then also restarts the broker app, which every client notices",
    )
    add_json(s, "the results")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vmsched")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown (not installed)"


# ---------------------------------------------------------------- the error boundary
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
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        stdout_gone()
        return EXIT_BROKEN_PIPE
    except Exception as exc:
        cluster = getattr(args, "cluster", None)
        failure = explain_failure(exc, getattr(args, "needs", None), cluster if cluster != "*" else None)
        if failure is None:
            report_unexpected(exc, debug)
            return EXIT_ERROR
        print(f"vmsched: {failure.message}", file=sys.stderr)
        if failure.hint:
            print(f"  {failure.hint}", file=sys.stderr)
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        return failure.code


if __name__ == "__main__":
    sys.exit(main())
