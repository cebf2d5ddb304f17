"""`vmsched units list`: the policy-unit catalogue, built-in and plugins, and the refused plugins."""

from __future__ import annotations

import argparse
import json

from vmsched_services.tools.clikit import EXIT_OK, SubParsers, add_json, command, group


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
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """The `vmsched units` command group."""
    units = group(sub, "units", "policy units")
    s = command(units, "list", "the unit catalogue", cmd_units_list)
    add_json(s, "the catalogue")


__all__ = ["add_commands", "cmd_units_list"]
