"""The `vmsched` command.

vmsched up                         all services in this process (development)
vmsched run SERVICE                one service: state-tracker, filter-worker, weigher, selector,
                                   balancer, ha-monitor, policy-admin
vmsched schedule --cluster C --vm vm.json
vmsched explain REQUEST_ID         a decision's full table (filters and weights per host)
vmsched watch [--cluster C]        decisions, migrations, power advice and HA alerts, live
vmsched state --cluster C          what the state tracker knows
vmsched db migrate                 create/upgrade the PostgreSQL schema, seed built-in policies
vmsched contracts [--check]        (re)generate contracts/ from the message models
vmsched units list                 the policy-unit catalogue
vmsched policy list|show|export|apply -f FILE|clone|delete|attach|detach|history|rollback|import-nova
                                   administer policies (the policy-admin service), from files in git
vmsched demo [--json]              a simulated datacenter, end to end
vmsched bench [--json-out FILE]    decision latency and throughput, with and without the bus
vmsched chaos [EXPERIMENT ...] [--long] [--json]
                                   the fault suite against the configured servers

A new command is a `cmd_NAME(args) -> exit code` function here plus its parser in the `_add_*_commands`
group it belongs to. Each command imports what it runs inside its function: `vmsched --help` and the
light commands then start in about half the time, without loading the services, NumPy or the drivers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vmsched.settings import Settings
from vmsched_services.tools.policy_cli import add_commands as add_policy_commands


def _settings() -> Settings:
    return Settings()


def cmd_run(args: argparse.Namespace) -> int:
    from vmsched_services.runner import run

    asyncio.run(run([args.service], _settings()))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from vmsched_services import SERVICES
    from vmsched_services.runner import run

    asyncio.run(run(list(SERVICES), _settings()))
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from vmsched.client import SchedulerClient
    from vmsched.contracts import VmSpec
    from vmsched.errors import VmschedError

    text = sys.stdin.read() if args.vm == "-" else Path(args.vm).read_text()
    try:
        vm = VmSpec.model_validate_json(text)
    except ValueError as exc:
        print(f"vmsched: {args.vm}: {exc}", file=sys.stderr)
        return 2

    async def go() -> int:
        async with SchedulerClient(_settings()) as client:
            try:
                decision = await client.schedule(
                    args.cluster,
                    vm,
                    blacklist=args.exclude or (),
                    max_alternates=args.alternates,
                    explain_scores=args.scores,
                    explain_hosts=args.hosts,
                    timeout=args.timeout,
                )
            except VmschedError as exc:
                print(f"vmsched: {exc.code}: {exc}", file=sys.stderr)
                return 1
        if args.json:
            print(decision.model_dump_json(indent=2))
        else:
            from vmsched.explain import render_decision

            print(render_decision(decision))
        return 0 if decision.status.value == "placed" else 3

    return asyncio.run(go())


def cmd_explain(args: argparse.Namespace) -> int:
    from vmsched.explain import render_table
    from vmsched.store import DecisionStore
    from vmsched.store.redis import connect

    async def go() -> int:
        settings = _settings()
        redis = connect(settings)
        try:
            decision = await DecisionStore(redis, settings).get(args.request_id)
        finally:
            await redis.aclose()
        if decision is None:
            print(
                f"vmsched: no decision stored for request {args.request_id} "
                "(decisions are kept for VMSCHED_DECISION_TTL_S; errors are not stored)",
                file=sys.stderr,
            )
            return 1
        print(decision.model_dump_json(indent=2) if args.json else render_table(decision, max_hosts=args.hosts))
        return 0

    return asyncio.run(go())


def cmd_watch(args: argparse.Namespace) -> int:
    from vmsched.client import SchedulerClient
    from vmsched.explain import render_event

    async def go() -> int:
        async with SchedulerClient(_settings()) as client:
            print(f"watching {args.cluster} (Ctrl-C to stop)", file=sys.stderr)
            async for event in client.events(args.cluster):
                print(event.model_dump_json() if args.json else render_event(event), flush=True)
        return 0

    return asyncio.run(go())


def cmd_state(args: argparse.Namespace) -> int:
    from vmsched.client import SchedulerClient

    async def go() -> int:
        async with SchedulerClient(_settings()) as client:
            state = await client.state(args.cluster)
        if args.json:
            print(state.model_dump_json(indent=2))
            return 0
        print(f"cluster {state.cluster_id} at version {state.version}: {len(state.hosts)} hosts, {len(state.vms)} VMs")
        for h in state.hosts:
            r = h.report
            print(
                f"  {r.host_id:<24} {r.status.value:<14} cpu {r.cpu_usage_pct:5.1f}% of {r.cpu_cores:>3} cores  "
                f"mem free {r.mem_free_mb:>8} / {r.physical_mem_mb:>8} MB  committed {h.mem_committed_mb:>8} MB  "
                f"vms {h.vm_count}"
            )
        return 0

    return asyncio.run(go())


def cmd_db_migrate(args: argparse.Namespace) -> int:
    from vmsched.db import migrate

    applied = asyncio.run(migrate(args.dsn or _settings().postgres_url))
    print(f"applied {len(applied)} migration(s){': ' + ', '.join(applied) if applied else ''}; schema up to date")
    return 0


def cmd_contracts(args: argparse.Namespace) -> int:
    from vmsched.contracts.asyncapi import check, write

    root = Path(args.out)
    if args.check:
        problems = check(root)
        if problems:
            print(
                f"contracts/ is out of date with the message models: {', '.join(problems)}\n"
                "run `vmsched contracts` and commit the result",
                file=sys.stderr,
            )
            return 1
        print("contracts/ matches the message models")
        return 0
    changed = write(root)
    print(f"wrote {len(changed)} file(s) under {root}" + (": " + ", ".join(changed) if changed else ""))
    return 0


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
        return 0
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
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from vmsched_services.tools.demo import main as demo_main

    return demo_main(args, _settings())


def cmd_bench(args: argparse.Namespace) -> int:
    from vmsched_services.tools.bench import main as bench_main

    return bench_main(args, _settings())


def cmd_chaos(args: argparse.Namespace) -> int:
    import tempfile

    from vmsched.db import migrate
    from vmsched_services.tools.chaos import EXPERIMENTS
    from vmsched_services.tools.chaos.render import render_table

    unknown = [n for n in args.experiments if n not in EXPERIMENTS]
    if unknown:
        print(f"vmsched: unknown experiment(s) {unknown}; known: {', '.join(EXPERIMENTS)}", file=sys.stderr)
        return 2
    names = args.experiments or list(EXPERIMENTS)
    settings = _settings()
    log_root = Path(tempfile.mkdtemp(prefix="vmsched-chaos-"))

    async def go() -> list[dict[str, object]]:
        await migrate(settings.postgres_url)  # the selector reads policies; idempotent
        results = []
        for name in names:
            if not args.json:
                print(f"running {name} ({'long' if args.long else 'short'}) ...", file=sys.stderr, flush=True)
            try:
                result = await EXPERIMENTS[name].run(settings, log_root / name, long=args.long)
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
    return 0 if all(r["passed"] for r in results) else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vmsched", description="VM scheduler services and tools.")
    p.add_argument("--version", action="version", version=f"vmsched {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    _add_service_commands(sub)
    _add_engine_commands(sub)
    _add_admin_commands(sub)
    add_policy_commands(sub)
    _add_tool_commands(sub)
    return p


def _add_service_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("run", help="run one service")
    s.add_argument(
        "service", help="state-tracker | filter-worker | weigher | selector | balancer | ha-monitor | policy-admin"
    )
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("up", help="run every service in this process (development)")
    s.set_defaults(fn=cmd_up)


def _add_engine_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """What an engine does over the bus, from a shell."""
    s = sub.add_parser("schedule", help="send one schedule request and print the decision")
    s.add_argument("--cluster", required=True)
    s.add_argument("--vm", required=True, help="a JSON file with the VM (VmSpec), or - for stdin")
    s.add_argument("--exclude", action="append", help="a host not to use (repeatable)")
    s.add_argument("--alternates", type=int, default=3)
    s.add_argument("--scores", action="store_true", help="include the score table (vmsched explain shows it)")
    s.add_argument(
        "--hosts", action="store_true", help="list every removed host with its reason, even when the VM is placed"
    )
    s.add_argument("--timeout", type=float, default=None)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_schedule)

    s = sub.add_parser("explain", help="print a decision's full table: filters and weights per host")
    s.add_argument("request_id")
    s.add_argument("--hosts", type=int, default=8, help="host columns to show (0: all)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_explain)

    s = sub.add_parser("watch", help="print decisions, migrations, power advice and HA alerts as they happen")
    s.add_argument("--cluster", default="*", help="one cluster, or * for all")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_watch)

    s = sub.add_parser("state", help="print a cluster's state as the state tracker has it")
    s.add_argument("--cluster", required=True)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_state)


def _add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = sub.add_parser("db", help="database commands").add_subparsers(dest="db_command", required=True)
    s = db.add_parser("migrate", help="create the database if missing and apply migrations")
    s.add_argument("--dsn", default=None)
    s.set_defaults(fn=cmd_db_migrate)

    s = sub.add_parser("contracts", help="generate contracts/ from the message models")
    s.add_argument("--out", default="contracts")
    s.add_argument("--check", action="store_true", help="fail if contracts/ differs from the models")
    s.set_defaults(fn=cmd_contracts)

    units = sub.add_parser("units", help="policy units").add_subparsers(dest="units_command", required=True)
    s = units.add_parser("list", help="the unit catalogue")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_units_list)


def _add_tool_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The demo, the bench and the fault suite."""
    s = sub.add_parser("demo", help="simulate a datacenter end to end over the bus")
    s.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    s.add_argument("--clusters", type=int, default=3)
    s.add_argument("--hosts", type=int, default=20, help="hosts per cluster")
    s.add_argument("--requests", type=int, default=300)
    s.add_argument("--concurrency", type=int, default=16)
    s.add_argument("--seed", type=int, default=7)
    s.add_argument("--external", action="store_true", help="use services already running (vmsched up)")
    s.add_argument("--keep", action="store_true", help="keep the demo's clusters in Redis afterwards")
    s.set_defaults(fn=cmd_demo)

    s = sub.add_parser("bench", help="measure decision latency and throughput")
    s.add_argument(
        "--hosts",
        default="100,1000",
        help="hosts per cluster, comma-separated (10000 works; reporting it takes a while)",
    )
    s.add_argument("--requests", type=int, default=200, help="decisions per size over the bus")
    s.add_argument("--concurrency", type=int, default=32, help="requests in flight at once, one cluster")
    s.add_argument("--clusters", type=int, default=10, help="also spread requests over N clusters (1: do not)")
    s.add_argument(
        "--spread-concurrency", type=int, default=64, help="requests in flight at once over the --clusters clusters"
    )
    s.add_argument("--json-out", default="bench-results/bench.json")
    s.add_argument("--seed", type=int, default=11)
    s.set_defaults(fn=cmd_bench)

    s = sub.add_parser("chaos", help="run the fault suite against the configured servers (own prefixes)")
    s.add_argument(
        "experiments", nargs="*", help="worker_kill | selector_kill | stale_holder | broker_drop | hostile_input"
    )
    s.add_argument(
        "--long",
        action="store_true",
        help="the full sizes (minutes); broker_drop then also restarts the broker app, which every client notices",
    )
    s.add_argument("--json", action="store_true", help="print the results as one JSON object")
    s.set_defaults(fn=cmd_chaos)


#: Exit codes: 0 done, 1 the command failed (a server down, an error answered), 2 a usage mistake
#: (argparse's own code too: bad options, a missing or unreadable input file), 130 interrupted.
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vmsched")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


def _explain_failure(exc: BaseException) -> tuple[str, int] | None:
    """What to tell a user instead of a traceback, and the exit code; None for a real bug."""
    from vmsched.errors import BusUnavailable, NoConsumer, VmschedError

    if isinstance(exc, NoConsumer):
        return f"{exc}\n  start the services (`vmsched up`, or `vmsched run SERVICE` for each)", EXIT_ERROR
    if isinstance(exc, BusUnavailable):
        return str(exc), EXIT_ERROR
    if isinstance(exc, VmschedError):
        return str(exc), EXIT_ERROR
    if isinstance(exc, FileNotFoundError | IsADirectoryError | PermissionError):
        return f"{exc.filename}: {exc.strerror}", EXIT_USAGE
    # Imported here: the CLI must start without a server library being loadable for --help.
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        url = _settings().redis_url
        return f"Redis ({url}) is unreachable: {exc} Start it, or point VMSCHED_REDIS_URL at a running one.", EXIT_ERROR
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        # `vmsched watch | head`: the reader left; say nothing more (stdout is gone anyway).
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stream until exit
        return EXIT_ERROR
    except Exception as exc:
        told = _explain_failure(exc)
        if told is None:
            raise
        message, code = told
        print(f"vmsched: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
