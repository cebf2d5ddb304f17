"""`vmsched db migrate`: create or upgrade the PostgreSQL schema and seed the built-in policies."""

from __future__ import annotations

import argparse
import asyncio

from vmsched_services.tools.clikit import EXIT_OK, SubParsers, command, env_help, group, settings


def cmd_db_migrate(args: argparse.Namespace) -> int:
    from vmsched.db import migrate
    from vmsched.logging import SECRETS
    from vmsched.reach import TlsFiles
    from vmsched.settings import url_passwords

    cfg = settings()
    if args.dsn:  # a password given on the command line is as secret as one in the environment
        SECRETS.add(url_passwords(args.dsn))
    applied = asyncio.run(migrate(args.dsn or cfg.postgres_url, tls=TlsFiles.of(cfg, "postgres")))
    print(f"applied {len(applied)} migration(s){': ' + ', '.join(applied) if applied else ''}; schema up to date")
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """The `vmsched db` command group."""
    db = group(sub, "db", "database commands")
    s = command(db, "migrate", "create the database if missing and apply migrations", cmd_db_migrate)
    s.add_argument("--dsn", default=None, metavar="URL", help=env_help("postgres_url", "the database"))


__all__ = ["add_commands", "cmd_db_migrate"]
