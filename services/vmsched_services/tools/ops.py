"""The operators' commands: `ha-check`, `dead-letters`, `decisions`, `clusters`, `hosts remove`.

What changes something (removing clusters and hosts, requeueing dead letters) is asked of the
policy-admin service, which refuses it unless the command's AMQP user is an administrator
(not_authorized, exit 3) and records it in the audit log (`vmsched audit`).

Each `cmd_*` takes the parsed arguments and returns an exit code (vmsched_services.tools.clikit);
what it cannot do it raises (CommandError, or the library's own errors), and `vmsched`'s error
boundary (cli.main) turns that into a sentence. Like cli.py, each command imports what it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from vmsched_services.tools.clikit import (
    EXIT_CHECK_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    CommandError,
    NotFound,
    UsageError,
    confirm,
    settings,
)

if TYPE_CHECKING:
    from vmsched.bus import Bus, DeadLetter
    from vmsched.client import SchedulerClient
    from vmsched.contracts import ClusterState, HaReport, Removal, ScheduleDecision

T = TypeVar("T")

#: How many dead letters `show ID` and `requeue ID` look through for an id.
SCAN_LIMIT = 10_000
#: Characters of a dead letter's body `show` prints.
BODY_PREVIEW = 4000
#: How often a removal is looked for in the state while waiting for the state tracker to apply it.
POLL_S = 0.1


def _when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t is not None else "-"


def _one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


async def _client_session(fn: Callable[[SchedulerClient], Awaitable[T]]) -> T:
    from vmsched.client import SchedulerClient

    async with SchedulerClient(settings()) as client:
        return await fn(client)


async def _bus_session(fn: Callable[[Bus], Awaitable[T]]) -> T:
    from vmsched.bus import connect

    async with connect(settings(), "cli") as bus:
        return await fn(bus)


# ---------------------------------------------------------------- ha-check
def render_ha_report(r: HaReport) -> str:
    if not r.enabled:
        return (
            f"cluster {r.cluster_id}: HA reservation is off, nothing was checked "
            "(it is turned on in the cluster's policy: ha_reservation)"
        )
    counted = f"{r.hosts} hosts, {r.ha_vms} HA VMs, checked in {r.elapsed_ms:.1f} ms at {_when(r.checked_at)}"
    if r.ok:
        return f"cluster {r.cluster_id}: HA reservation check passed ({counted})"
    return (
        f"cluster {r.cluster_id}: HA reservation check FAILED ({counted})\n"
        f"HA VMs on host(s) {', '.join(r.failing_hosts)} could not be restarted elsewhere if their host failed: "
        "add resources or shut down unused VMs"
    )


def cmd_ha_check(args: argparse.Namespace) -> int:
    report = asyncio.run(_client_session(lambda client: client.ha_check(args.cluster, timeout=args.timeout)))
    print(report.model_dump_json(indent=2) if args.json else render_ha_report(report))
    return EXIT_CHECK_FAILED if report.enabled and not report.ok else EXIT_OK


# ---------------------------------------------------------------- dead letters
def _dead_letter_summary(n: int, dl: DeadLetter) -> dict[str, Any]:
    return {
        "n": n,
        "id": dl.id,
        "dead_lettered_at": dl.dead_lettered_at.isoformat() if dl.dead_lettered_at else None,
        "queue": dl.queue,
        "service": dl.service or None,
        "exchange": dl.exchange,
        "routing_key": dl.routing_key,
        "type": dl.type,
        "reason": dl.reason,
        "body_bytes": len(dl.body),
        "truncated": dl.truncated,
    }


def cmd_dead_letters_list(args: argparse.Namespace) -> int:
    letters = asyncio.run(_bus_session(lambda bus: bus.dead_letters(limit=args.limit)))
    if args.json:
        print(json.dumps([_dead_letter_summary(n, d) for n, d in enumerate(letters, 1)], indent=2))
        return EXIT_OK
    if not letters:
        print("the dead-letter queue is empty")
        return EXIT_OK
    print(f"{'#':>4}  {'id':<12}  {'dead-lettered':<23}  {'queue':<34}  {'service':<14}  reason")
    for n, d in enumerate(letters, 1):
        print(
            f"{n:>4}  {d.id:<12}  {_when(d.dead_lettered_at):<23}  {_one_line(d.queue, 34):<34}  "
            f"{(d.service or '-'):<14}  {_one_line(d.reason or '-', 70)}"
        )
    if len(letters) == args.limit:
        print(f"(the first {args.limit}, oldest first; --limit shows more)", file=sys.stderr)
    return EXIT_OK


async def _find(bus: Bus, target: str) -> tuple[int, DeadLetter]:
    """A dead letter by position in the queue (1 is the oldest) or by id (one in 400 ids is all
    digits: a number as long as an id is one)."""
    from vmsched import constants as c

    if target.isdigit() and len(target) < c.DEAD_LETTER_ID_LENGTH:
        n = int(target)
        if n < 1:
            raise UsageError("dead letters are numbered from 1 (the oldest)")
        letters = await bus.dead_letters(limit=n)
        if len(letters) < n:
            raise NotFound(
                f"there is no dead letter {n}: the queue holds {len(letters)}",
                hint="`vmsched dead-letters list` shows them",
            )
        return n, letters[n - 1]
    for n, dl in enumerate(await bus.dead_letters(limit=SCAN_LIMIT), 1):
        if dl.id == target:
            return n, dl
    raise NotFound(
        f"no dead letter with id {target} (among the first {SCAN_LIMIT})",
        hint="`vmsched dead-letters list` shows them",
    )


def _body_preview(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace")
    with contextlib.suppress(ValueError):  # not JSON: shown as it is
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    if len(text) > BODY_PREVIEW:
        return text[:BODY_PREVIEW] + f"\n... ({len(text) - BODY_PREVIEW} more characters)"
    return text


def render_dead_letter(n: int, dl: DeadLetter, requeue_problem: str | None) -> str:
    size = f"{len(dl.body)} bytes"
    if dl.truncated:
        size += f" (cut from {dl.headers.get('x-vmsched-original-size', '?')})"
    if dl.exchange is None:
        destination = f"routing key {dl.routing_key or '-'} (exchange not recorded)"
    else:
        destination = f"exchange {dl.exchange or '(default)'}, routing key {dl.routing_key or '-'}"
    lines = [
        f"dead letter {n} (id {dl.id})",
        f"  dead-lettered  {_when(dl.dead_lettered_at)} by {dl.service or 'unknown'}",
        f"  queue          {dl.queue}",
        f"  published to   {destination}",
        f"  type           {dl.type or '-'}",
        f"  reason         {dl.reason or '-'}",
        f"  body           {size}",
        f"  requeue        {'possible' if requeue_problem is None else 'not possible: ' + requeue_problem}",
        "",
        _body_preview(dl.body),
    ]
    return "\n".join(lines)


def _requeue_problem(dl: DeadLetter, prefix: str) -> str | None:
    from vmsched import constants as c

    return dl.unrequeueable((*(f"{prefix}{x}" for x in c.RPC_EXCHANGES), f"{prefix}{c.EVENTS_EXCHANGE}", ""))


def cmd_dead_letters_show(args: argparse.Namespace) -> int:
    n, dl = asyncio.run(_bus_session(lambda bus: _find(bus, args.target)))
    problem = _requeue_problem(dl, settings().amqp_prefix)
    if args.json:
        doc = _dead_letter_summary(n, dl)
        doc["headers"] = {k: str(v) for k, v in dl.headers.items()}
        doc["body"] = dl.body.decode("utf-8", errors="replace")
        doc["requeue_problem"] = problem
        print(json.dumps(doc, indent=2))
    else:
        print(render_dead_letter(n, dl, problem))
    return EXIT_OK


async def _requeue(bus: Bus, targets: Sequence[str], every: bool) -> tuple[list[str], dict[str, str], list[str]]:
    """(requeued, skipped with why, asked for but not found). Numbers are made ids here; the
    requeueing is policy-admin's (an administrator's, audited)."""
    from vmsched.contracts import RequeueReport
    from vmsched.policy_client import PolicyClient

    admin = PolicyClient(settings(), bus=bus)
    if every:
        done = await _admin_call("policy-admin", admin.requeue_dead_letters(None))
        return done.requeued, done.skipped, []
    ids: list[str] = []
    missing: list[str] = []
    for target in targets:
        try:
            ids.append((await _find(bus, target))[1].id)
        except NotFound:
            missing.append(target)
    done = RequeueReport(requeued=[])
    if ids:
        done = await _admin_call("policy-admin", admin.requeue_dead_letters(list(dict.fromkeys(ids))))
    return done.requeued, done.skipped, missing + done.not_found  # not found: taken by someone meanwhile


async def _admin_call(service: str, call: Awaitable[T]) -> T:
    """`call`, a request to `service`: when nobody serves it, say which service to start (the
    command's `needs` names the state tracker, which it also asks)."""
    from vmsched.errors import NoConsumer

    try:
        return await call
    except NoConsumer:
        raise CommandError(
            f"no {service} answers: removals and requeues are asked of it (it checks and audits them)",
            hint=f"start it (`vmsched run {service}`, or every service with `vmsched up`)",
        ) from None


def cmd_dead_letters_requeue(args: argparse.Namespace) -> int:
    if args.all == bool(args.targets):
        raise UsageError("name the dead letters to requeue (N or ID), or pass --all")
    if args.all:
        confirm("requeue every dead letter whose destination is known?", yes=args.yes)
    requeued, skipped, missing = asyncio.run(_bus_session(lambda bus: _requeue(bus, args.targets, args.all)))
    if requeued:
        print(f"requeued {len(requeued)}: {', '.join(requeued)}")
    elif args.all and not skipped:
        print("the dead-letter queue is empty")
    for ident, why in skipped.items():
        print(f"left in the queue: {ident}: {why}", file=sys.stderr)
    for target in missing:
        print(f"not found: {target}", file=sys.stderr)
    return EXIT_NOT_FOUND if skipped or missing else EXIT_OK


# ---------------------------------------------------------------- decisions
def render_decision_row(d: ScheduleDecision) -> str:
    when = d.decided_at.strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"{when}  {d.request_id}  {_one_line(d.vm_id, 20):<20}  {d.status.value:<11}  "
        f"{(d.host_id or '-'):<20}  {_one_line(d.explanation.summary, 80)}"
    )


def cmd_decisions(args: argparse.Namespace) -> int:
    from vmsched.store import DecisionStore
    from vmsched.store.redis import connect

    cfg = settings()

    async def go() -> list[ScheduleDecision]:
        redis = connect(cfg)
        try:
            return await DecisionStore(redis, cfg).recent(args.cluster, args.limit)
        finally:
            await redis.aclose()

    decisions = asyncio.run(go())
    if args.json:
        print(json.dumps([json.loads(d.model_dump_json()) for d in decisions], indent=2))
    elif decisions:
        print(f"{'decided (UTC)':<19}  {'request':<36}  {'vm':<20}  {'status':<11}  {'host':<20}  summary")
        for d in decisions:
            print(render_decision_row(d))
    if not decisions:
        raise NotFound(
            f"no decisions stored for cluster {args.cluster}",
            hint="decisions are kept for $VMSCHED_DECISION_TTL_S, errors are not stored; "
            "`vmsched clusters list` shows the clusters with state",
        )
    return EXIT_OK


# ---------------------------------------------------------------- clusters and hosts
def cmd_clusters_list(args: argparse.Namespace) -> int:
    from vmsched.store import StateCache
    from vmsched.store.redis import connect

    cfg = settings()

    async def go() -> list[str]:
        redis = connect(cfg)
        try:
            return await StateCache(redis, cfg).clusters()
        finally:
            await redis.aclose()

    clusters = asyncio.run(go())
    if args.json:
        print(json.dumps(clusters))
    else:
        for cluster in clusters:
            print(cluster)
    if not clusters:
        raise NotFound("no cluster has reported state yet")
    return EXIT_OK


async def _wait_until(what: str, done: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Poll `done` until it holds; CommandError after `timeout` seconds (the tracker applies in order)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await done():
        if loop.time() > end:
            raise CommandError(
                f"{what} was published, but the state tracker has not applied it within {timeout:g} s",
                hint="is the state-tracker running (`vmsched run state-tracker`)? It applies the removal "
                "in order when it comes back; `vmsched state --cluster C` shows where it stands",
            )
        await asyncio.sleep(POLL_S)


def cmd_hosts_remove(args: argparse.Namespace) -> int:
    cluster = args.cluster
    asked = list(dict.fromkeys(args.hosts))
    audited: list[Removal] = []

    async def go(client: SchedulerClient) -> tuple[list[str], list[str], int]:
        known = {h.report.host_id for h in (await client.state(cluster, timeout=args.timeout)).hosts}
        present = [h for h in asked if h in known]
        missing = [h for h in asked if h not in known]
        if not present:
            raise NotFound(
                f"cluster {cluster} has no host {', '.join(missing)}",
                hint=f"`vmsched state --cluster {cluster}` lists its hosts",
            )
        removal = await _admin_call("policy-admin", client.remove_hosts(cluster, present, reason=args.reason))
        audited.append(removal)
        version = 0

        async def gone() -> bool:
            nonlocal version
            state = await client.state(cluster, timeout=args.timeout)
            version = state.version
            return not set(present) & {h.report.host_id for h in state.hosts}

        await _wait_until(f"the removal of {', '.join(present)}", gone, args.wait)
        return present, missing, version

    present, missing, version = asyncio.run(_client_session(go))
    print(f"removed {', '.join(present)} from cluster {cluster} (state version {version})")
    print(f"recorded in the audit log as entry {audited[0].audit_id}")
    print("a host that reports again is back", file=sys.stderr)
    if missing:
        print(f"not in cluster {cluster}: {', '.join(missing)}", file=sys.stderr)
        return EXIT_NOT_FOUND
    return EXIT_OK


def cmd_clusters_remove(args: argparse.Namespace) -> int:
    from vmsched.errors import RemoteError

    cluster = args.cluster
    state: ClusterState = asyncio.run(_client_session(lambda client: client.state(cluster, timeout=args.timeout)))
    # Asked outside any bus session: a prompt must not hold a connection open.
    confirm(
        f"remove cluster {cluster} ({len(state.hosts)} hosts, {len(state.vms)} VMs): its state and pending "
        "resources are deleted?",
        yes=args.yes,
    )

    async def go(client: SchedulerClient) -> Removal:
        removal = await _admin_call("policy-admin", client.remove_cluster(cluster, reason=args.reason))

        async def gone() -> bool:
            try:
                await client.state(cluster, timeout=args.timeout)
            except RemoteError as exc:
                if exc.remote_code == "unknown_cluster":
                    return True
                raise
            return False

        await _wait_until(f"the removal of cluster {cluster}", gone, args.wait)
        return removal

    removal = asyncio.run(_client_session(go))
    print(
        f"removed cluster {cluster}: its state and pending resources are gone; its policy link in PostgreSQL "
        "is kept, and a cluster that reports again is back"
    )
    print(f"recorded in the audit log as entry {removal.audit_id}")
    return EXIT_OK


__all__ = [
    "cmd_clusters_list",
    "cmd_clusters_remove",
    "cmd_dead_letters_list",
    "cmd_dead_letters_requeue",
    "cmd_dead_letters_show",
    "cmd_decisions",
    "cmd_ha_check",
    "cmd_hosts_remove",
]
