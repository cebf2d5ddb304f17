"""`vmsched units list`: the policy-unit catalogue, built-in and plugins, the refused plugins, and
each running service instance's catalogue (RPC `units.list`); `vmsched units running`: the latter only."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from vmsched.contracts import RunningInstance
from vmsched_services.tools.clikit import EXIT_OK, SubParsers, add_json, command, group, settings

#: How long `units list` waits for the running instances before printing the catalogue without them.
RUNNING_WAIT_S = 5.0


async def _running(wait_s: float | None = None) -> list[RunningInstance]:
    from vmsched.policy_client import PolicyClient

    async with asyncio.timeout(wait_s):
        async with PolicyClient(settings()) as admin:
            return (await admin.units()).instances


def render_running(instances: list[RunningInstance]) -> list[str]:
    """One line per running instance: service, id, catalogue hash, unit count, plugin units, lacking."""
    if not instances:
        return ["no running service instance announced its units"]
    lines = [f"{'service':<14} {'instance':<32} {'catalogue':<12} {'units':>5}  plugin units / lacks"]
    for i in instances:
        plugins = ", ".join(f"{name} ({origin})" for name, origin in i.plugins.items()) or "none"
        lacks = f"; LACKS {', '.join(i.lacks)} (policies using them skip it)" if i.lacks else ""
        lines.append(f"{i.service:<14} {i.instance:<32} {i.catalogue:<12} {i.units:>5}  {plugins}{lacks}")
    return lines


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
    # The units above are this machine's; a service elsewhere may lack a plugin (or have another).
    print("\nrunning instances (each one's own catalogue):")
    try:
        running = asyncio.run(_running(RUNNING_WAIT_S))
    except Exception as exc:
        print(
            f"  not known: policy-admin did not answer ({type(exc).__name__}: {exc}); "
            "`vmsched units running` asks again",
            file=sys.stderr,
        )
        return EXIT_OK
    for line in render_running(running):
        print(f"  {line}")
    return EXIT_OK


def cmd_units_running(args: argparse.Namespace) -> int:
    """Each running service instance's catalogue: its id, catalogue hash, units from plugins, and the
    units others of its service have that it lacks."""
    running = asyncio.run(_running())
    if args.json:
        print(json.dumps([json.loads(i.model_dump_json(exclude={"schema_version"})) for i in running], indent=2))
    else:
        print("\n".join(render_running(running)))
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """The `vmsched units` command group."""
    units = group(sub, "units", "policy units")
    s = command(units, "list", "the unit catalogue", cmd_units_list)
    add_json(s, "the catalogue (this machine's units only)")
    s = command(units, "running", "each running instance's units", cmd_units_running, needs="policy-admin")
    add_json(s, "the instances")


__all__ = ["add_commands", "cmd_units_list", "cmd_units_running", "render_running"]
