"""`vmsched run SERVICE` and `vmsched up`: the services, in this process.

The services configure their own logs (cli.main leaves them alone for these two commands).
"""

from __future__ import annotations

import argparse

from vmsched_services.tools.clikit import EXIT_OK, SubParsers, command, settings


def cmd_run(args: argparse.Namespace) -> int:
    from vmsched_services import eventloop
    from vmsched_services.runner import run

    cfg = settings()
    eventloop.run(run([args.service], cfg), cfg)
    return EXIT_OK


def cmd_up(args: argparse.Namespace) -> int:
    from vmsched_services import SERVICES, eventloop
    from vmsched_services.runner import run

    cfg = settings()
    # Development: one process, one user with every right; that user administers too, so the
    # `vmsched` commands run as it (guest on a local broker) can change policies.
    own = cfg.amqp_user or "guest"  # aio-pika's user when the URL names none
    # It is the api's user too, so the api's writes are audited for its tokens' names.
    cfg = cfg.model_copy(
        update={
            "admin_users": ",".join(filter(None, (cfg.admin_users, own))),
            "api_users": ",".join(filter(None, (cfg.api_users, own))),
        }
    )
    eventloop.run(run(list(SERVICES), cfg), cfg)
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """`run` and `up`."""
    s = command(sub, "run", "run one service", cmd_run)
    from vmsched_services import SERVICES  # loaded with this package already

    s.add_argument("service", choices=list(SERVICES), help="the service to run")
    command(sub, "up", "run every service in this process (development)", cmd_up)


__all__ = ["add_commands", "cmd_run", "cmd_up"]
