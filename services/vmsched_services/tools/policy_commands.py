"""The `vmsched policy ...` commands (their parser, and the policy file format, are in
vmsched_services.tools.policy_cli): read and write policy files, print reports, call the
policy-admin service through PolicyClient."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from vmsched import bounded_text
from vmsched.client import SchedulerClient
from vmsched.contracts import ApplyReport, ChangeAction, ClusterAttachment, PolicyDocument, PolicySet
from vmsched.errors import CommandError, InvalidRequest, NoConsumer, NotFound, RemoteError
from vmsched.policy_client import PolicyClient
from vmsched.scheduling.policy_docs import diff
from vmsched.scheduling.units.registry import REGISTRY
from vmsched.settings import Settings
from vmsched_services.tools.failures import NOT_FOUND_CODES, remote_hint
from vmsched_services.tools.inputs import POLICY_CAP, read_bounded
from vmsched_services.tools.nova_import import import_nova

#: Exit codes, as the rest of the vmsched command's: done, what was named does not exist (a policy, a
#: cluster), the file or arguments are wrong, refused (the service said why). A server that does not
#: answer is told by the command's error boundary.
OK, NOT_FOUND, BAD_INPUT, REFUSED = 0, 1, 2, 3


def _say(text: str) -> None:
    print(text, file=sys.stderr)


# ------------------------------------------------------------------------------ files
def _expand(raw: Any) -> Any:
    """Accept a filter written as its unit name alone."""
    policies = raw.get("policies") if isinstance(raw, dict) else None
    if isinstance(policies, list):  # anything else is for validation to refuse, saying where
        for policy in policies:
            if isinstance(policy, dict) and isinstance(policy.get("filters"), list):
                policy["filters"] = [{"unit": f} if isinstance(f, str) else f for f in policy["filters"]]
    return raw


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "the top level"


def read_set(path: str, cap: int = POLICY_CAP) -> PolicySet:
    """A PolicySet from a YAML or JSON file ("-": standard input) of at most `cap` bytes; a file too
    big, unreadable or not UTF-8 is a UsageError, one that does not hold a valid set InvalidRequest."""
    text = read_bounded(path, cap, "policy file", "policies", hint="--max-size SIZE reads a bigger one")
    raw = bounded_text.load(text, "standard input" if path == "-" else path)
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{path}: expected a mapping with 'policies' and/or 'clusters'")
    try:
        return PolicySet.model_validate(_expand(raw))
    except ValidationError as exc:
        lines = [f"  {_where(e['loc'])}: {e['msg']}" for e in exc.errors()[:20]]
        raise InvalidRequest(f"{path}: {exc.error_count()} problem(s):\n" + "\n".join(lines)) from None


def dump_set(policies: PolicySet) -> str:
    """The set as YAML, filters that run in list order written as plain unit names."""
    data = policies.model_dump(mode="json", exclude={"policies": {"__all__": {"schema_version"}}})
    for policy in data["policies"]:
        policy["filters"] = [f["unit"] if f["position"] == "any" else f for f in policy["filters"]]
        for w in policy["weights"]:
            w.pop("schema_version", None)
        for f in policy["filters"]:
            if isinstance(f, dict):
                f.pop("schema_version", None)
        if policy["balance"] is None:
            del policy["balance"]
    for cluster in data["clusters"]:
        cluster.pop("schema_version", None)
    data.pop("schema_version", None)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


# ------------------------------------------------------------------------------ printing
def render_report(report: ApplyReport) -> str:
    verb = "would" if report.dry_run else "did"
    lines = []
    for ch in report.changes:
        version = f" (version {ch.version})" if ch.version is not None else ""
        lines.append(f"{ch.kind} {ch.name}: {ch.action.value}{version}")
        lines += [f"    {line}" for line in ch.diff]
    changed = sum(ch.action is not ChangeAction.UNCHANGED for ch in report.changes)
    lines.append(f"{changed} change(s) {verb} apply; {len(report.changes) - changed} unchanged")
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ commands
Command = Callable[[argparse.Namespace, PolicyClient], Coroutine[Any, Any, int]]


async def _list(args: argparse.Namespace, admin: PolicyClient) -> int:
    listing = await admin.read()
    print(f"{'name':<28}{'version':>8}  {'flags':<16}{'clusters':<24}description")
    for p in listing.policies:
        flags = ",".join(f for f, on in (("built-in", p.locked), ("default", p.default)) if on) or "-"
        clusters = ",".join(p.clusters[:3]) + (f" +{len(p.clusters) - 3}" if len(p.clusters) > 3 else "") or "-"
        print(f"{p.document.name:<28}{p.version:>8}  {flags:<16}{clusters:<24}{p.document.description[:60]}")
    return OK


async def _show(args: argparse.Namespace, admin: PolicyClient) -> int:
    listing = await admin.read([args.name])
    stored = listing.policies[0]
    print(f"# version {stored.version}{', built-in (locked)' if stored.locked else ''}; id {stored.id}")
    print(dump_set(PolicySet(policies=[stored.document], clusters=listing.clusters)), end="")
    return OK


async def _export(args: argparse.Namespace, admin: PolicyClient) -> int:
    listing = await admin.read(args.names or None)
    chosen = [p for p in listing.policies if args.names or args.all or not p.locked]
    names = {p.document.name for p in chosen}
    text = dump_set(
        PolicySet(policies=[p.document for p in chosen], clusters=[a for a in listing.clusters if a.policy in names])
    )
    if args.output in (None, "-"):
        print(text, end="")
    else:
        await asyncio.to_thread(Path(args.output).write_text, text, encoding="utf-8")
        _say(f"wrote {len(chosen)} policies to {args.output}")
    return OK


async def _apply(args: argparse.Namespace, admin: PolicyClient) -> int:
    print(render_report(await admin.apply(args.desired, dry_run=args.dry_run)))
    return OK


async def _clone(args: argparse.Namespace, admin: PolicyClient) -> int:
    stored = await admin.clone(args.source, args.name, description=args.description)
    print(f"policy {stored.document.name}: created from {args.source} (version {stored.version})")
    return OK


async def _delete(args: argparse.Namespace, admin: PolicyClient) -> int:
    print(render_report(await admin.delete(args.name)))
    return OK


def _properties(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"--set {pair!r}: expected NAME=VALUE")
        out[key] = value
    return out


async def _cluster_known(cluster: str, admin: PolicyClient) -> None:
    """Refuse a cluster vmsched has never heard of (no policy attached, no state: a mistyped id, most
    likely); --force skips this, for a cluster the engine has not reported yet."""
    try:
        await SchedulerClient(admin.settings, bus=admin.bus).state(cluster)
    except NoConsumer:
        raise CommandError(
            f"cannot tell whether cluster {cluster} exists: no state-tracker answers",
            hint="start it (`vmsched run state-tracker`), or pass --force to attach without checking",
        ) from None
    except RemoteError as exc:
        if exc.remote_code != "unknown_cluster":
            raise
        raise NotFound(
            f"cluster {cluster} is unknown: no state has been reported for it and no policy is attached to it; "
            "nothing attached",
            hint="check the id (`vmsched clusters list` shows the clusters with state); to attach a policy "
            "before the engine reports the cluster, pass --force",
        ) from None


def merged_attachment(
    current: ClusterAttachment | None,
    cluster: str,
    policy: str,
    *,
    set_: dict[str, str],
    unset: list[str],
    ha_reservation: bool | None,
) -> tuple[ClusterAttachment, list[str]]:
    """The attachment `attach` stores: the cluster's current one (its overrides, its HA reservation)
    with what the command gives changed, and a line for each thing that is turned off or dropped."""
    properties = dict(current.properties) if current is not None else {}
    notes: list[str] = []
    for name in unset:
        if name not in properties:
            raise InvalidRequest(f"--unset {name}: cluster {cluster} has no override of {name}")
        notes.append(f"property override {name}={properties.pop(name)} removed")
    properties.update(set_)
    was_on = current is not None and current.ha_reservation
    ha = was_on if ha_reservation is None else ha_reservation
    if was_on and not ha:
        notes.append(f"HA reservation turned OFF for cluster {cluster} (it was on)")
    attachment = ClusterAttachment(cluster_id=cluster, policy=policy, properties=properties, ha_reservation=ha)
    return attachment, notes


async def _attach(args: argparse.Namespace, admin: PolicyClient) -> int:
    current = next((a for a in (await admin.read()).clusters if a.cluster_id == args.cluster), None)
    if current is None and not args.force:
        await _cluster_known(args.cluster, admin)
    attachment, notes = merged_attachment(
        current,
        args.cluster,
        args.policy,
        set_=_properties(args.set),
        unset=args.unset or [],
        ha_reservation=args.ha_reservation,
    )
    report = await admin.apply(PolicySet(clusters=[attachment]), dry_run=args.dry_run)
    print(render_report(report))
    for note in notes:
        _say(f"{'would be: ' if args.dry_run else ''}{note}")
    return OK


async def _detach(args: argparse.Namespace, admin: PolicyClient) -> int:
    print(render_report(await admin.detach(args.cluster)))
    return OK


async def _history(args: argparse.Namespace, admin: PolicyClient) -> int:
    history = await admin.history(args.name)
    older = None
    for v in reversed(history.versions):
        print(f"version {v.version}  {v.stored_at:%Y-%m-%d %H:%M:%S %Z}  by {v.author or 'unknown'}")
        for line in diff(older, v.document):
            print(f"    {line}")
        older = v.document
    return OK


async def _rollback(args: argparse.Namespace, admin: PolicyClient) -> int:
    print(render_report(await admin.rollback(args.name, args.to)))
    return OK


async def _import_nova(args: argparse.Namespace, admin: PolicyClient) -> int:
    print(render_report(await admin.apply(PolicySet(policies=[args.document]), dry_run=args.dry_run)))
    return OK


def _nova_document(path: str, name: str) -> PolicyDocument:
    """nova.conf's policy, validated as `policy apply` validates (the units this command has);
    what was left out is said on standard error, problems refuse it (exit 2)."""
    result = import_nova(path, name, REGISTRY)
    for warning in result.warnings:
        _say(f"vmsched policy import-nova: warning: {warning}")
    if result.problems:
        lines = "\n".join(f"  {p}" for p in result.problems)
        raise InvalidRequest(f"{path}: {len(result.problems)} problem(s), nothing imported:\n{lines}")
    return result.document


def _read_files(args: argparse.Namespace) -> bool:
    """Read and check the command's file before the bus is opened: a wrong file is said at once, not
    after a connection (nor instead of it, with the broker down). False: nothing is left to do."""
    if args.policy_command == "apply":
        args.desired = read_set(args.file, args.max_size)
    elif args.policy_command == "import-nova":
        args.document = _nova_document(args.file, args.name)
        if not (args.apply or args.dry_run):
            print(dump_set(PolicySet(policies=[args.document])), end="")
            return False
    return True


def run(command: Command, args: argparse.Namespace, settings: Settings) -> int:
    """Run a policy command; the service's refusals and bad input end in one clear message (and the
    rest, a server down or a file too big say, in the vmsched command's error boundary)."""

    async def go() -> int:
        async with PolicyClient(settings) as admin:
            return await command(args, admin)

    try:
        return asyncio.run(go()) if _read_files(args) else OK
    except InvalidRequest as exc:
        _say(f"vmsched policy: {exc}")
        return BAD_INPUT
    except RemoteError as exc:
        _say(f"vmsched policy: {exc.remote_code}: {exc}")
        if exc.remote_code in ("not_authorized", "policy_not_found", "unknown_cluster"):
            _say(f"  {remote_hint(exc.remote_code)}")
        return NOT_FOUND if exc.remote_code in NOT_FOUND_CODES else REFUSED


#: The commands by name, for vmsched_services.tools.policy_cli.
COMMANDS: dict[str, Command] = {
    "list": _list,
    "show": _show,
    "export": _export,
    "apply": _apply,
    "clone": _clone,
    "delete": _delete,
    "attach": _attach,
    "detach": _detach,
    "history": _history,
    "rollback": _rollback,
    "import-nova": _import_nova,
}

__all__ = ["COMMANDS", "dump_set", "merged_attachment", "read_set", "render_report", "run"]
