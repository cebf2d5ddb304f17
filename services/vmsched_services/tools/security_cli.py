"""`vmsched security init|print|apply`: the roles' credentials and the definitions each server takes.

vmsched security init DIR              generate (or complete) DIR: passwords, definitions, URLs
vmsched security print rabbitmq DIR    the RabbitMQ definitions (users hashed), for load_definitions
vmsched security apply DIR --rabbitmq-node NODE --redis --postgres
                                       apply them to running servers, as their administrator
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from vmsched.errors import UsageError
from vmsched_services.tools.clikit import EXIT_OK, SubParsers, command, group, settings

#: What `print` shows, by server: the file under the credentials directory.
PRINTABLE = {
    "rabbitmq": Path("rabbitmq") / "definitions.json",
    "redis": Path("redis") / "users.acl",
    "postgres": Path("postgres") / "roles.sql",
}


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. rabbitmq:5672)")
    return value


def cmd_security_init(args: argparse.Namespace) -> int:
    from vmsched_services.tools.security.credentials import SERVERS, Endpoints, write_all

    endpoints = Endpoints(
        amqp=args.amqp,
        redis=args.redis,
        postgres=args.postgres,
        database=args.database,
        amqp_tls=args.amqps,
        redis_tls=args.rediss,
        postgres_sslmode=args.sslmode,
    )
    try:
        write_all(Path(args.dir), settings(), endpoints, rotate=args.rotate or ())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"wrote {args.dir} (readable by you only):")
    for name, path in PRINTABLE.items():
        print(f"  {args.dir}/{path}  ({name})")
    for role, servers in SERVERS.items():
        print(f"  {args.dir}/{role}/  {', '.join(f'{s}_url' for s in servers)}, env")
    if args.rotate:
        print(f"new passwords for: {', '.join(args.rotate)}; apply them, then restart those roles")
    return EXIT_OK


def _directory(raw: str) -> Path:
    d = Path(raw)
    if not (d / PRINTABLE["rabbitmq"]).is_file():
        raise UsageError(f"{raw} is not a credentials directory", hint=f"make one: vmsched security init {raw}")
    return d


def cmd_security_print(args: argparse.Namespace) -> int:
    print(((_directory(args.dir)) / PRINTABLE[args.server]).read_text(encoding="utf-8"), end="")
    return EXIT_OK


def cmd_security_apply(args: argparse.Namespace) -> int:
    from vmsched.logging import SECRETS
    from vmsched_services.tools.security import apply
    from vmsched_services.tools.security.credentials import Credentials

    d = _directory(args.dir)
    creds = Credentials.load(d)
    for by_role in creds.passwords.values():
        SECRETS.add(by_role.values())
    if not (args.rabbitmq_node or args.rabbitmq_api or args.redis or args.postgres):
        raise UsageError("name what to apply: --rabbitmq-node/--rabbitmq-api, --redis, --postgres")
    cfg = settings()
    definitions = d / PRINTABLE["rabbitmq"]
    if args.rabbitmq_node:
        asyncio.run(apply.rabbitmq_with_ctl(definitions, apply.local_rabbitmqctl(args.rabbitmq_node)))
        print(f"RabbitMQ node {args.rabbitmq_node}: users {apply.summary(definitions)}")
    if args.rabbitmq_api:
        if not args.rabbitmq_api_password_file:
            raise UsageError("--rabbitmq-api needs --rabbitmq-api-password-file (the administrator's password)")
        password = Path(args.rabbitmq_api_password_file).read_text(encoding="utf-8").strip()
        SECRETS.add([password])
        print(apply.rabbitmq_with_api(definitions, args.rabbitmq_api, args.rabbitmq_api_user, password))
    if args.redis:
        count = asyncio.run(apply.redis_users(cfg, creds.of("redis"), disable_default=args.disable_default_redis_user))
        print(f"Redis: {count} ACL users set")
    if args.postgres:
        asyncio.run(apply.postgres_roles(cfg.postgres_url, d / PRINTABLE["postgres"]))
        print("PostgreSQL: roles and grants applied")
    return EXIT_OK


def add_commands(sub: SubParsers[argparse.ArgumentParser]) -> None:
    """The `vmsched security` command group."""
    sec = group(sub, "security", "credentials per role, and the definitions RabbitMQ, Redis and PostgreSQL take")
    s = command(
        sec,
        "init",
        "generate a credentials directory: one password per role and server, definitions, connection URLs",
        cmd_security_init,
        description="Generate (or complete: existing passwords are kept) a credentials directory. Every file "
        "is readable by you only. docs/security.md says what each role may do.",
    )
    s.add_argument("dir", metavar="DIR", help="the credentials directory (created 0700 if missing)")
    s.add_argument("--amqp", type=_host_port, default="127.0.0.1:5672", help="RabbitMQ as the roles reach it")
    s.add_argument("--redis", type=_host_port, default="127.0.0.1:6379", help="Redis as the roles reach it")
    s.add_argument("--postgres", type=_host_port, default="127.0.0.1:5432", help="PostgreSQL as the roles reach it")
    s.add_argument("--database", default="vmsched", help="the PostgreSQL database (default vmsched)")
    s.add_argument("--amqps", action="store_true", help="the roles connect to RabbitMQ over TLS")
    s.add_argument("--rediss", action="store_true", help="the roles connect to Redis over TLS")
    s.add_argument(
        "--sslmode",
        default="prefer",
        choices=["disable", "prefer", "require", "verify-ca", "verify-full"],
        help="PostgreSQL sslmode in the roles' URLs (default prefer; verify-full where the server has a certificate)",
    )
    s.add_argument("--rotate", action="append", metavar="ROLE", help="new passwords for ROLE (repeatable)")

    s = command(sec, "print", "print one server's definitions (passwords hashed)", cmd_security_print)
    s.add_argument("server", choices=sorted(PRINTABLE), help="which server's definitions")
    s.add_argument("dir", metavar="DIR", help="the credentials directory (vmsched security init DIR)")

    s = command(sec, "apply", "apply a credentials directory's definitions to running servers", cmd_security_apply)
    s.add_argument("dir", metavar="DIR", help="the credentials directory (vmsched security init DIR)")
    s.add_argument("--rabbitmq-node", metavar="NODE", help="import into this node with rabbitmqctl (rabbit@host)")
    s.add_argument("--rabbitmq-api", metavar="URL", help="import through the management API (http://host:15672)")
    s.add_argument("--rabbitmq-api-user", default="admin", help="the management API's administrator")
    s.add_argument("--rabbitmq-api-password-file", metavar="FILE", help="that administrator's password, in a file")
    s.add_argument("--redis", action="store_true", help="set the ACL users on the Redis of VMSCHED_REDIS_URL")
    s.add_argument(
        "--disable-default-redis-user",
        action="store_true",
        help="switch Redis's default user off (connect with an administrative user of your own first)",
    )
    s.add_argument("--postgres", action="store_true", help="create the roles on the PostgreSQL of VMSCHED_POSTGRES_URL")


__all__ = ["add_commands"]
