"""`vmsched bench`: every measurement, in order, into one JSON document; then the figures printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vmsched.logging import configure
from vmsched.scheduling.policy import DEFAULT_POLICY
from vmsched.settings import Settings
from vmsched_services.tools.bench.balance import BALANCE_HOSTS_MAX, bench_balance
from vmsched_services.tools.bench.batches import batch_cost, bench_batches
from vmsched_services.tools.bench.bus import bench_bus
from vmsched_services.tools.bench.codec import bench_codec
from vmsched_services.tools.bench.data import policies
from vmsched_services.tools.bench.floors import bench_hop, bench_lock
from vmsched_services.tools.bench.ha import bench_ha
from vmsched_services.tools.bench.in_process import bench_in_process
from vmsched_services.tools.bench.report import render
from vmsched_services.tools.bench.stack import cleanup
from vmsched_services.tools.bench.suite import run_suite


async def run_bench(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    settings = settings.model_copy(
        update={
            "amqp_prefix": f"bench-{tag}.",
            "redis_prefix": f"vmsched-bench-{tag}",
            "log_level": "WARNING",
        }
    )
    sizes = [int(x) for x in str(args.hosts).split(",") if x.strip()]
    if getattr(args, "suite", False):
        n = max(sizes, default=1000)
        print(f"bench: the suite, {n} hosts per cluster, {args.requests} requests per workload ...", file=sys.stderr)
        try:
            suite = await run_suite(settings, n, args.requests, args.seed, tag, only=_names(args.workloads))
        finally:
            await cleanup(settings)
        return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": _machine(), "suite": suite}
    if getattr(args, "batches", 0):
        # Only the big batches beside another cluster's small requests (bench.batches).
        n = max(sizes, default=1000)
        print(f"bench: one batch of 1,000 / 3,000 / 10,000 VMs on {n} hosts, in process ...", file=sys.stderr)
        cost = await batch_cost(n, [1000, 3000, 10_000], args.seed)
        batches = await bench_batches(settings, n, args.batches, args.batch_size, args.seed)
        await cleanup(settings)
        return {"when": datetime.now(UTC).isoformat(timespec="seconds"), "batches": {**batches, "cpu_s": cost}}
    result: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": _machine(),
        "policy": DEFAULT_POLICY.name,
        "hop": await bench_hop(settings, 300),
        "lock": await bench_lock(settings, 300),
        "ha_check": bench_ha(args.seed),
        "sizes": {},
    }
    # The balance pass at 10x the largest cluster size (10,000 hosts by default), 20 VMs per host,
    # capped at the 10,000 hosts the performance target names (10x of --hosts 10000 would be two
    # million VMs).
    balance_hosts = min(10 * max(sizes, default=100), BALANCE_HOSTS_MAX)
    print(f"bench: balance pass, {balance_hosts} hosts ...", file=sys.stderr)
    result["balance_pass"] = bench_balance(args.seed, balance_hosts, 20 * balance_hosts)
    for n in sizes:
        entry: dict[str, Any] = {"codec": bench_codec(n, args.seed)}
        for name, policy in policies().items():
            print(f"bench: {n} hosts, policy {name} ...", file=sys.stderr)
            entry[name] = {
                "units": len(policy.filters) + len(policy.weights),
                "in_process": await bench_in_process(n, max(200, args.requests), args.seed, policy),
                "bus": await bench_bus(
                    settings,
                    n,
                    args.requests,
                    args.concurrency,
                    args.seed,
                    policy,
                    clusters=args.clusters,
                    spread_concurrency=args.spread_concurrency,
                ),
            }
            entry[name]["bus_over_in_process"] = round(
                entry[name]["bus"]["sequential"]["p50_ms"] / max(entry[name]["in_process"]["p50_ms"], 1e-9), 1
            )
        result["sizes"][str(n)] = entry
    await cleanup(settings)
    return result


def _names(value: str | None) -> frozenset[str] | None:
    return None if value is None else frozenset(x.strip() for x in value.split(",") if x.strip())


def _machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "cpus": os.cpu_count() or 0, "platform": platform.platform()}


def main(args: argparse.Namespace, settings: Settings) -> int:
    configure("WARNING", "console")
    result = asyncio.run(run_bench(args, settings))
    out = Path(args.json_out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(render(result))
    print(f"\nwritten to {out}")
    return 0


__all__ = ["main", "run_bench"]
