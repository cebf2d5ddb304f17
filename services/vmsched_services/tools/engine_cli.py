"""What an engine does over the bus, from a shell: `schedule`, `explain`, `watch`, `state`.

Each `cmd_*` takes the parsed arguments and returns an exit code; what it cannot do it raises, and
cli.main turns that into a sentence. Each command imports what it runs, so `vmsched --help` does
not load pydantic, the message models or the drivers.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from vmsched_services.tools.clikit import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNPLACEABLE,
    CommandError,
    NotFound,
    SubParsers,
    UsageError,
    add_cluster,
    add_json,
    add_timeout,
    cluster_or_all,
    command,
    request_id,
    settings,
    vmsched_id,
)
from vmsched_services.tools.failures import remote_failure, validation_problems

if TYPE_CHECKING:
    from vmsched.contracts import ScheduleDecision, VmSpec


def read_vm(source: str) -> VmSpec:
    """The VM of `vmsched schedule --vm`: a file, or - for stdin. Each way it can be wrong is a
    UsageError naming the file and, for a VM that does not validate, the fields."""
    from pydantic import ValidationError

    from vmsched import bounded_text
    from vmsched.contracts import VmSpec
    from vmsched.errors import InvalidRequest
    from vmsched_services.tools.inputs import VM_CAP, read_bounded

    name = "stdin" if source == "-" else source
    raw = read_bounded(source, VM_CAP, "VM file", "VMs")
    try:
        bounded_text.load_json(raw, name)  # where it is not JSON, or nests too deep, before the fields
    except InvalidRequest as exc:
        raise UsageError(str(exc)) from None
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
            return await DecisionStore(redis, cfg).get(args.cluster, args.request_id)
        finally:
            await redis.aclose()

    decision = asyncio.run(go())
    if decision is None:
        raise NotFound(
            f"no decision stored for request {args.request_id} of cluster {args.cluster}",
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


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
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
    add_cluster(s)
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


__all__ = ["add_commands", "cmd_explain", "cmd_schedule", "cmd_state", "cmd_watch", "read_vm"]
