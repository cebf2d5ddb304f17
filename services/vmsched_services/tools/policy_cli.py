"""`vmsched policy ...`: the command group's parser. The commands (vmsched_services.tools.
policy_commands) are imported when one runs, so `vmsched --help` does not load the bus or the
message models.

Policies live in YAML files an administrator keeps in git:

    policies:
      - name: web-spread
        description: spread web VMs, keep 25% headroom
        filters: [Memory, CPU, Network, {unit: PinToHost, position: first}]
        weights:
          - {unit: OptimalForEvenCpuDistribution, factor: 2}
          - {unit: OptimalForEvenMemoryDistribution, factor: 1.5}   # factors are decimals
        properties: {HighUtilization: "75"}
    clusters:
      - {cluster_id: c1, policy: web-spread, ha_reservation: true}

`vmsched policy apply -f FILE` makes the stored policies match (idempotent, shows the diff,
`--dry-run`); `vmsched policy export` writes the same format back.
"""

from __future__ import annotations

import argparse
from functools import partial

from vmsched_services.tools.inputs import POLICY_CAP, byte_size, human


def _run(name: str, args: argparse.Namespace) -> int:
    from vmsched_services.tools.clikit import settings
    from vmsched_services.tools.policy_commands import COMMANDS, run

    return run(COMMANDS[name], args, settings())


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `vmsched policy` command group."""
    policy = sub.add_parser("policy", help="administer policies (the policy-admin service must run)")
    cmds = policy.add_subparsers(dest="policy_command", required=True)

    def add(name: str, text: str) -> argparse.ArgumentParser:
        p = cmds.add_parser(name, help=text, description=text)
        p.set_defaults(fn=partial(_run, name), needs="policy-admin")
        return p

    add("list", "every policy: version, built-in/default, clusters")
    add("show", "one policy as YAML, with the clusters attached to it").add_argument("name", help="the policy's name")
    p = add("export", "policies and attachments as a YAML file to keep in git (built-ins with --all)")
    p.add_argument("names", nargs="*", help="only these policies")
    p.add_argument("--all", action="store_true", help="include the built-in policies")
    p.add_argument("-o", "--output", help="write to this file (default: standard output)")
    p = add("apply", "make policies and attachments match a file; shows what changes")
    p.add_argument("-f", "--file", required=True, help="a YAML or JSON policy set, - for standard input")
    p.add_argument("--dry-run", action="store_true", help="validate and show the changes, store nothing")
    p.add_argument(
        "--max-size",
        type=byte_size,
        default=POLICY_CAP,
        metavar="SIZE",
        help=f"refuse a bigger file, unread (default: {human(POLICY_CAP)}; K, M, G suffixes)",
    )
    p = add("clone", "copy a policy (built-ins too) under a new name, to edit it")
    p.add_argument("source", help="the policy to copy")
    p.add_argument("name", help="the new policy's name")
    p.add_argument("--description", help="the new policy's description (default: the source's)")
    add("delete", "delete a policy no cluster uses").add_argument("name", help="the policy's name")
    p = add(
        "attach",
        "make a cluster run a policy; its property overrides and HA reservation are kept unless changed",
    )
    p.add_argument("cluster", help="the cluster's id")
    p.add_argument("policy", help="the policy's name")
    p.add_argument(
        "--set", action="append", metavar="NAME=VALUE", help="a property override for this cluster (others are kept)"
    )
    p.add_argument("--unset", action="append", metavar="NAME", help="remove this cluster's override of a property")
    p.add_argument(
        "--ha-reservation",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep room to restart one failed host's HA VMs, or not (default: as the cluster has it now; off for "
        "a cluster attached for the first time)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="attach a cluster vmsched does not know yet (no state reported, no policy attached)",
    )
    p.add_argument("--dry-run", action="store_true", help="validate and show the change, store nothing")
    add("detach", "the cluster goes back to the default policy").add_argument("cluster", help="the cluster's id")
    add("history", "a policy's stored versions and what each changed").add_argument("name", help="the policy's name")
    p = add("rollback", "store an earlier version again (default: the one before the current)")
    p.add_argument("name", help="the policy's name")
    p.add_argument("--to", type=int, metavar="VERSION", help="the version to store again")
    p = add("import-nova", "a policy from nova.conf's enabled_filters and weight multipliers")
    p.add_argument("file", help="a nova.conf")
    p.add_argument("--name", required=True, help="the new policy's name")
    p.add_argument("--apply", action="store_true", help="store it (default: validate it and print it as YAML)")
    p.add_argument(
        "--dry-run", action="store_true", help="validate it and show what storing it would change, store nothing"
    )


__all__ = ["add_commands"]
