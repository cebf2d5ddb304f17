"""`vmsched audit`: who did which administrative write or destructive action, newest first (the
audit log policy-admin keeps in PostgreSQL and serves as RPC `audit.read`)."""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from vmsched_services.tools.clikit import EXIT_OK, NotFound, SubParsers, add_json, command, positive_int, settings

if TYPE_CHECKING:
    from vmsched.contracts import AuditEntry, AuditListing

#: Characters of an entry's details the table shows (--json shows them whole).
DETAILS_WIDTH = 90


def since(value: str) -> datetime:
    """argparse type for --since: an ISO 8601 date or date-time; one without an offset is UTC."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date or date-time: ISO 8601, such as 2026-01-31 or 2026-01-31T08:00:00+01:00"
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _details(details: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in details.items())
    return text if len(text) <= DETAILS_WIDTH else text[: DETAILS_WIDTH - 3] + "..."


def render_entry(e: AuditEntry) -> str:
    return f"{e.at:%Y-%m-%d %H:%M:%S}  {e.actor:<20}  {e.action:<22}  {e.target:<24}  {_details(e.details)}"


def cmd_audit(args: argparse.Namespace) -> int:
    from vmsched.policy_client import PolicyClient

    async def go() -> AuditListing:
        async with PolicyClient(settings()) as admin:
            return await admin.audit(limit=args.limit, actor=args.actor, action=args.action, since=args.since)

    entries = asyncio.run(go()).entries
    if args.json:
        print(json.dumps([json.loads(e.model_dump_json(exclude={"schema_version"})) for e in entries], indent=2))
    elif entries:
        print(f"{'at (UTC)':<19}  {'actor':<20}  {'action':<22}  {'target':<24}  details")
        for e in entries:
            print(render_entry(e))
    if not entries:
        raise NotFound(
            "no audit log entries" + (" match" if args.actor or args.action or args.since else ""),
            hint="every policy change, removal and requeue is recorded; --actor, --action and --since narrow it",
        )
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """`vmsched audit`."""
    s = command(
        sub,
        "audit",
        "who changed policies, removed clusters or hosts, requeued dead letters: the audit log, newest first",
        cmd_audit,
        needs="policy-admin",
    )
    s.add_argument("--actor", metavar="USER", help="only this AMQP user's actions")
    s.add_argument(
        "--action",
        metavar="ACTION",
        help="only this action: policy.created, policy.updated, policy.cloned, policy.deleted, policy.rolled-back, "
        "cluster.attached, cluster.detached, cluster.removed, hosts.removed, dead-letters.requeued",
    )
    s.add_argument("--since", type=since, metavar="WHEN", help="only entries at or after this ISO 8601 date-time")
    s.add_argument("--limit", type=positive_int, default=50, metavar="N", help="how many (default: 50)")
    add_json(s, "the entries")


__all__ = ["add_commands", "cmd_audit", "render_entry", "since"]
