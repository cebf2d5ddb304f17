"""Applying a credentials directory's definitions to running servers, as their administrator.

RabbitMQ takes its definitions through `rabbitmqctl import_definitions` (on a machine that reaches
the node, with its Erlang cookie) or the management API (POST /api/definitions); users, permissions
and the topology already there are updated in place, nothing else is removed. Redis ACL users are
reset and set again, so a right taken away in a new version is gone. PostgreSQL runs the roles'
SQL in one transaction.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from vmsched.errors import CommandError
from vmsched.settings import Settings, redacted_url
from vmsched_services.tools.security import redis_acl

#: Runs `rabbitmqctl ARGS...` against the right node; its output (raises if it failed).
Rabbitmqctl = Callable[..., Awaitable[str]]
#: Bound on one call to the management API.
API_TIMEOUT_S = 30.0


async def rabbitmq_with_ctl(definitions: Path, ctl: Rabbitmqctl) -> str:
    """`rabbitmqctl import_definitions FILE`."""
    return await ctl("import_definitions", str(definitions))


def local_rabbitmqctl(node: str | None) -> Rabbitmqctl:
    """rabbitmqctl on this machine's PATH (with `-n NODE` when given), as the calling user."""

    async def run(*args: str) -> str:
        argv = ["rabbitmqctl", *(["-n", node] if node else []), *args]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
        except FileNotFoundError:
            raise CommandError(
                "rabbitmqctl is not on this machine's PATH",
                hint="run the command where rabbitmqctl is, or give --rabbitmq-api URL (the management API)",
            ) from None
        out, _ = await proc.communicate()
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise CommandError(f"rabbitmqctl {args[0]} failed: {text.strip()[-800:]}")
        return text

    return run


def rabbitmq_with_api(definitions: Path, api_url: str, user: str, password: str) -> str:
    """POST the definitions to the management API at `api_url` (http(s)://host:15672)."""
    parts = urlsplit(api_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CommandError(
            f"--rabbitmq-api {redacted_url(api_url)!r} is not an http(s)://host:port URL of the management API"
        )
    body = definitions.read_bytes()
    request = urllib.request.Request(
        api_url.rstrip("/") + "/api/definitions",
        data=body,
        method="POST",
        headers={
            "content-type": "application/json",
            "authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii"),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=API_TIMEOUT_S) as reply:
            return f"the management API took the definitions ({reply.status})"
    except urllib.error.HTTPError as exc:
        said = exc.read(2000).decode(errors="replace")
        if exc.code == 401:
            raise CommandError(
                f"the management API at {parts.hostname}:{parts.port} refused the credentials (401)",
                hint="give an administrator's user and password (RABBITMQ_API_USER / RABBITMQ_API_PASSWORD_FILE)",
            ) from None
        raise CommandError(f"the management API refused the definitions ({exc.code}): {said}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CommandError(f"no management API at {parts.hostname}:{parts.port}: {exc}") from None


async def redis_users(settings: Settings, passwords: Mapping[str, str], *, disable_default: bool) -> int:
    """Set every role's ACL user on the Redis of `settings`, connecting as its user (an
    administrator: ACL SETUSER); how many users were set. Behind Sentinel, run it against the
    master and each replica (ACLs are not replicated)."""
    from vmsched.store.redis import connect  # noqa: PLC0415 - only this command needs a Redis client

    redis = connect(settings)
    try:
        chosen = redis_acl.users(passwords, settings.redis_prefix, cluster=settings.redis_cluster)
        await redis_acl.apply(redis, chosen, disable_default=disable_default)
    finally:
        await redis.aclose()
    return len(chosen)


async def postgres_roles(dsn: str, roles_sql: Path) -> None:
    """Run the roles' SQL in one transaction, as the user of `dsn` (the database's owner)."""
    import asyncpg  # noqa: PLC0415 - only this command needs it here

    sql = await asyncio.to_thread(roles_sql.read_text, encoding="utf-8")
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        async with conn.transaction():
            await conn.execute(sql)
    finally:
        await conn.close()


def summary(definitions: Path) -> str:
    """One line per user of a definitions file (names only, never a secret)."""
    doc = json.loads(definitions.read_text(encoding="utf-8"))
    return ", ".join(u["name"] for u in doc.get("users", []))


__all__ = [
    "local_rabbitmqctl",
    "postgres_roles",
    "rabbitmq_with_api",
    "rabbitmq_with_ctl",
    "redis_users",
    "summary",
]
