"""`vmsched demo`, `bench`, `simulate` and `chaos`: the tools that run the whole system (or its
decision path) against generated data and report on it. Each command imports its tool when it
runs; the tools themselves live in modules of their own under vmsched_services.tools.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from vmsched_services.tools.clikit import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    SubParsers,
    UsageError,
    add_json,
    command,
    positive_int,
    settings,
)
from vmsched_services.tools.inputs import WORKLOAD_CAP, WORKLOAD_YAML_CAP, byte_size, human


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


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
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
    s.add_argument(
        "--batches",
        type=positive_int,
        default=None,
        metavar="N",
        help="only: N big batches on one cluster of the largest --hosts size, and another cluster's latency meanwhile",
    )
    s.add_argument(
        "--suite",
        action="store_true",
        help="only: the workload table (basic, spread over 10 clusters, hosts churning, unschedulable"
        " mixed in, sequential, 10x hosts, a burst of 1,000) at the largest --hosts size, --requests each",
    )
    s.add_argument(
        "--workloads",
        default=None,
        metavar="NAMES",
        help="with --suite: only these workloads, comma-separated (e.g. sequential,spread)",
    )
    s.add_argument(
        "--batch-size",
        type=positive_int,
        default=1000,
        metavar="N",
        help="VMs per batch with --batches (default: 1000, the most a request carries)",
    )

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
    source.add_argument(
        "--workload", metavar="FILE", help="a workload file, YAML, JSON or CSV (docs/workload.schema.json)"
    )
    source.add_argument(
        "--scenario", metavar="NAME", help="a built-in scenario: even-vm-count, ha-reservation, ha-reservation-balance"
    )
    source.add_argument(
        "--from-cluster",
        metavar="C",
        help="cluster C as it is now: its hosts and VMs from the state tracker, its policy from policy-admin "
        "(over the VMSCHED_* servers), simulated for --hours",
    )
    source.add_argument(
        "--trace",
        nargs=2,
        metavar=("FORMAT", "FILE"),
        help="a public VM trace: azure (the Azure public dataset's vmtable.csv) on --hosts hosts of 64 cores, 512 GB",
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
        "--max-workload-size",
        type=byte_size,
        metavar="SIZE",
        help=f"refuse a bigger --workload file, unread (default: {human(WORKLOAD_CAP)} as JSON or CSV, "
        f"{human(WORKLOAD_YAML_CAP)} as YAML; K, M, G suffixes)",
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
        "experiments",
        nargs="*",
        help="worker_kill | selector_kill | stale_holder | broker_drop | rabbit_node_loss | hostile_input | "
        "postgres_away | redis_away | redis_restart | redis_sentinel_failover | redis_cluster_failover | tracker_kill",
    )
    s.add_argument(
        "--long",
        action="store_true",
        help="the full sizes (minutes); broker_drop then also restarts the broker app, which every client notices",
    )
    add_json(s, "the results")


__all__ = ["add_commands", "cmd_bench", "cmd_chaos", "cmd_demo", "cmd_simulate", "hours"]
