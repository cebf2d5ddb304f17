"""The parsers of the operators' commands: `decisions`, `ha-check`, `dead-letters`, `clusters`,
`hosts register|remove`. The commands themselves are in vmsched_services.tools.ops (and
host_reports, `hosts register`).
"""

from __future__ import annotations

import argparse

from vmsched_services.tools import host_reports, ops
from vmsched_services.tools.clikit import (
    SubParsers,
    add_cluster,
    add_json,
    add_timeout,
    command,
    group,
    positive_int,
    seconds,
    vmsched_id,
)
from vmsched_services.tools.inputs import HOSTS_CAP, byte_size, human


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
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
        needs="policy-admin",
        description="Publish dead letters again to the exchange and routing key they were first published to, "
        "and remove them from the dead-letter queue. Only messages whose destination is known and whose body "
        "is whole are sent; the others stay, and the command says why. The policy-admin service does it for "
        "an administrator (VMSCHED_ADMIN_USERS) and records it in the audit log (`vmsched audit`).",
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
        "PostgreSQL and its stored decisions (until they expire) are kept. The policy-admin service publishes "
        "the removal for an administrator (VMSCHED_ADMIN_USERS) and records it in the audit log.",
    )
    s.add_argument("cluster", type=vmsched_id, help="the cluster's id")
    s.add_argument("--reason", default="", help="why, kept with the removal event")
    s.add_argument("--yes", action="store_true", help="do not ask first")
    _add_wait(s)
    add_timeout(s)

    hosts = group(sub, "hosts", "hosts of a cluster")
    s = command(
        hosts,
        "register",
        "publish hosts' reports from a JSON or YAML file, as the engine would (checked whole first)",
        host_reports.cmd_hosts_register,
        description="Publish hosts' reports from a file, as the engine publishes them: a JSON or YAML list of "
        "host reports (contracts/schemas/HostReport.json; cluster_id and reported_at may be left out), or a "
        "mapping whose `hosts` is that list. Every entry is checked first; one that is not a valid host report "
        "is named with its number, host and field, and nothing is published.",
    )
    add_cluster(s)
    s.add_argument("file", metavar="FILE", help="the hosts, JSON or YAML; - for standard input")
    s.add_argument(
        "--max-size",
        type=byte_size,
        default=HOSTS_CAP,
        metavar="SIZE",
        help=f"refuse a bigger file, unread (default: {human(HOSTS_CAP)}; K, M, G suffixes)",
    )

    s = command(
        hosts,
        "remove",
        "take hosts out of a cluster: drop them and the VMs counted on them (a host that reports again is back)",
        ops.cmd_hosts_remove,
        needs="state-tracker",
        description="Take hosts out of a cluster: the state tracker drops them and the VMs counted on them; a "
        "host that reports again is back. The policy-admin service publishes the removal for an administrator "
        "(VMSCHED_ADMIN_USERS) and records it in the audit log (`vmsched audit`).",
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


__all__ = ["add_commands"]
