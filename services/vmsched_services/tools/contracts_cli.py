"""`vmsched contracts [--check]`: (re)generate contracts/ (the AsyncAPI document and the JSON
Schemas) from the message models, or check that it matches them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vmsched_services.tools.clikit import EXIT_NOT_FOUND, EXIT_OK, CommandError, SubParsers, command


def checkout_contracts(package_dir: Path) -> Path | None:
    """contracts/ of the checkout the package was installed from (pip install -e .), if it was:
    the package then lives at <checkout>/libs/common/vmsched."""
    common = package_dir.parent
    if common.name != "common" or common.parent.name != "libs":
        return None
    root = common.parent.parent
    return root / "contracts" if (root / "pyproject.toml").is_file() else None


def _contracts_root(out: str | None) -> Path:
    if out is not None:
        return Path(out)
    import vmsched

    package_dir = Path(vmsched.__file__).resolve().parent
    found = checkout_contracts(package_dir)
    if found is None:
        raise CommandError(
            f"no contracts/ directory next to the installed package ({package_dir}): vmsched is not installed "
            "from a checkout",
            hint="run it from a checkout (pip install -e .), or name the directory with --out DIR",
        )
    return found


def cmd_contracts(args: argparse.Namespace) -> int:
    from vmsched_services.tools.asyncapi import check, write

    root = _contracts_root(args.out)
    if args.check:
        if not root.is_dir():
            raise CommandError(
                f"{root} does not exist: there is nothing to check",
                hint="name the checkout's contracts/ directory with --out, or generate it with `vmsched contracts`",
            )
        problems = check(root)
        if problems:
            print(
                f"{root} is out of date with the message models: {', '.join(problems)}\n"
                "run `vmsched contracts` and commit the result",
                file=sys.stderr,
            )
            return EXIT_NOT_FOUND
        print(f"{root} matches the message models")
        return EXIT_OK
    changed = write(root)
    print(f"wrote {len(changed)} file(s) under {root}" + (": " + ", ".join(changed) if changed else ""))
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """The `vmsched contracts` command."""
    s = command(sub, "contracts", "generate contracts/ from the message models", cmd_contracts)
    s.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="the contracts directory (default: contracts/ of the checkout vmsched is installed from)",
    )
    s.add_argument("--check", action="store_true", help="fail if the directory differs from the models")


__all__ = ["add_commands", "checkout_contracts", "cmd_contracts"]
