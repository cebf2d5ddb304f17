"""A failed connection to Redis named for what it is (RedisUnavailable with its `kind` and `hint`): the
login refused (password or ACL user), a command refused (NOPERM), TLS refused, nothing listening,
another kind of server at the address, or Redis away (vmsched.reach has the kinds every server shares).

The client connects lazily, so a process asks once at start (`check_at_start`): what only someone can
fix stops it there, with its message; Redis merely away is left to the readiness gate (the process
waits for it, not consuming).
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError

from vmsched.errors import RedisUnavailable
from vmsched.reach import Diagnosis, Target, TlsFiles, find_cause, generic, no_server, probed, tls_refused
from vmsched.settings import Settings


def target(settings: Settings) -> Target:
    tls = TlsFiles.of(settings, "redis") if settings.redis_url.startswith("rediss:") else None
    return Target("redis", settings.redis_url, tls)


def refusal(t: Target, exc: BaseException, prefix: str) -> Diagnosis | None:
    """Redis's own refusals: the login (AUTH: WRONGPASS, NOAUTH), a command or key (NOPERM)."""
    user = t.user or "default"
    login = find_cause(exc, AuthenticationError)
    if login is not None:
        return Diagnosis(
            "login_refused",
            f"{t.where} refused the login of user {user!r}: {login}",
            f"check the password (and ACL user) in {t.setting}: redis://USER:PASSWORD@host:6379/0, as "
            "`requirepass` or the server's ACL user has it",
        )
    denied = find_cause(exc, (NoPermissionError, AuthorizationError))
    if denied is not None:
        return Diagnosis(
            "permission_refused",
            f"{t.where} refused user {user!r} a command or key: {denied}",
            f"give the ACL user the keys under {prefix} and the commands vmsched uses, e.g. "
            f"`ACL SETUSER {user} ~{prefix}* +@all -@dangerous` (docs/operating.md)",
        )
    return None


def diagnose(settings: Settings, exc: BaseException) -> RedisUnavailable:
    """`exc`, from a command on the configured Redis, as the RedisUnavailable that names what went wrong.
    May ask what answers at redis_url's address (blocking, a few seconds at most): run it in a thread.
    Through sentinels or a cluster the address is not one server's, so nothing is asked there."""
    t = target(settings)
    found = refusal(t, exc, f"{settings.redis_prefix}:") or tls_refused(t, exc) or no_server(t, exc)
    if found is None:
        found = generic(t, exc) if settings.redis_sentinels or settings.redis_cluster else probed(t, exc)
    return RedisUnavailable(found.message, kind=found.kind, hint=found.hint)


async def check_at_start(client: aioredis.Redis, settings: Settings) -> RedisUnavailable | None:
    """PING Redis once: None if it answers; the failure named otherwise. Raises it when someone must act
    (a wrong password, missing rights, TLS, another server at the address): a process does not start
    to retry what cannot succeed."""
    try:
        await client.ping()
    except Exception as exc:  # every failure is named; which ones stop the start is the diagnosis's
        found = await asyncio.to_thread(diagnose, settings, exc)
        if found.needs_action:
            raise found from None
        return found
    return None


__all__ = ["check_at_start", "diagnose", "refusal", "target"]
