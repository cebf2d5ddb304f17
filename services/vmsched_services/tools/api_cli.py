"""`vmsched api token add NAME --role ROLE [--file FILE]`: a bearer token for the HTTP API.

The token is printed once, on standard output; the tokens file keeps only its SHA-256 (one
`NAME ROLE sha256:HEX` line, vmsched_services.api.auth), so it cannot be shown again: a lost token is
replaced by adding another and deleting the old line. The file defaults to $VMSCHED_API_TOKENS_FILE,
which the api service reads at start (restart it to take a new token).
"""

from __future__ import annotations

import argparse
import os
import sys

from vmsched_services.tools.clikit import EXIT_OK, SubParsers, UsageError, command, group

ROLES = ("viewer", "operator", "admin")


def cmd_token_add(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vmsched_services.api.auth import Role, add_token

    path = args.file or os.environ.get("VMSCHED_API_TOKENS_FILE")
    if not path:
        raise UsageError(
            "no tokens file: pass --file FILE or set VMSCHED_API_TOKENS_FILE",
            hint="the api reads the same file: set VMSCHED_API_TOKENS_FILE for it too",
        )
    token = add_token(Path(path), args.name, Role.parse(args.role))
    print(token)
    print(
        f"token {args.name} ({args.role}) added to {path}; it is shown only now: keep it in a secret store. "
        "Restart the api to use it.",
        file=sys.stderr,
    )
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """The `vmsched api` command group."""
    api = group(sub, "api", "the HTTP API's tokens")
    tokens = api.add_parser("token", help="bearer tokens", description="bearer tokens")
    token_cmds = tokens.add_subparsers(dest="token_command", required=True, metavar="COMMAND")
    p = command(token_cmds, "add", "make a token, store its hash in the tokens file, print it once", cmd_token_add)
    p.add_argument("name", help="the token's name (the audit log names it: `vmsched-api for NAME`)")
    p.add_argument("--role", required=True, choices=ROLES, help="viewer < operator < admin")
    p.add_argument("--file", help="the tokens file (default: $VMSCHED_API_TOKENS_FILE)")


__all__ = ["add_commands", "cmd_token_add"]
