"""Redis ACL users of vmsched's roles: each service kind may touch only its own keys, with only the
commands its code sends (least privilege), and the engine has no Redis user at all (it talks to the
bus only).

What each role may do was read off the code (vmsched.store and its callers), key by key:

* keys a role writes are granted read-write (`~pattern`), keys it only reads read-only
  (`%R~pattern`, Redis 7). A script's declared keys (EVALSHA's KEYS) must be read-write for EVALSHA
  itself to run, even when the script only reads them; so each role also gets a selector
  `(+evalsha ~<every pattern of the role>)` that lets EVALSHA name them. Commands inside a script
  are checked one by one against the user's own rules, so a script still writes no read-only key;
* commands are named one by one (`-@all` first), never by category: `+@write` would hand a reader
  every write command there is. No role gets FLUSHALL, FLUSHDB, KEYS, SCAN, CONFIG, ACL, DEBUG,
  MONITOR, SHUTDOWN, CLIENT, FUNCTION, SCRIPT FLUSH or EVAL (scripts go through EVALSHA, loaded with
  SCRIPT LOAD on a NOSCRIPT reply); of INFO only `INFO server` (`+info|server`), which the
  generation check (vmsched.store.generations) runs inside its scripts to read the server's run id;
* no pub/sub channel (`resetchannels`): vmsched uses none.

ACLs live on each server, not in the data: on Sentinel every server (primary and replicas) needs the
users, since any may be promoted; on Redis Cluster every node (`apply` given a cluster client sends
ACL SETUSER to all of them). Sentinels have their own users (vmsched authenticates to them with
VMSCHED_REDIS_SENTINEL_PASSWORD only). `cluster=True` adds what a Redis Cluster client sends besides
the keys' commands: CLUSTER SLOTS and COMMAND to learn the slots and the keys of commands, ASKING
while a slot migrates. `client_setinfo=True` allows the CLIENT SETINFO the client sends on connect
(Redis 7.2 and later; Redis 7.0 does not know the command and refuses the rule, and without the
rule a newer server only notes the refusal in ACL LOG: redis-py ignores it).

Passwords are given in clear or as `#<sha256 hex>` and are only ever written as their SHA-256
(`#<hex>`), in the ACL SETUSER arguments as in the aclfile lines.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from vmsched.constants import (
    KEY_CLUSTERS,
    KEY_COOLDOWN,
    KEY_DECISION,
    KEY_DECISION_HISTORY,
    KEY_FENCE,
    KEY_GENERATION,
    KEY_HA_STATE,
    KEY_LEASE,
    KEY_LOCK,
    KEY_MAINTENANCE,
    KEY_MIGRATION_BUDGET,
    KEY_PENDING,
    KEY_PENDING_VERSION,
    KEY_RESYNC,
    KEY_STATE_CHANGES,
    KEY_STATE_CLUSTER,
    KEY_STATE_HOSTS,
    KEY_STATE_REMOVED,
    KEY_STATE_VERSION,
    KEY_STATE_VMS,
    KEY_TRIED,
    KEY_UNITS,
    KEY_UNITS_INDEX,
    LEASE_BALANCER,
    LEASE_HA_MONITOR,
)
from vmsched.store.keys import UNITS_TAG, Keys
from vmsched_services.tools.security.roles import ADMIN, API, ENGINE, SERVICE_ROLES, user_name

#: The roles with a Redis user: every service kind and the administrators (the engine has none).
REDIS_ROLES: Final = (*SERVICE_ROLES, ADMIN)
#: Roles that must have no Redis user: `apply` deletes theirs if one was made before (the HTTP API
#: reads through the services' RPCs).
NO_REDIS_ROLES: Final = (ENGINE, API)

# ---------------------------------------------------------------- keys (suffixes after "<prefix>:")
_CLUSTER = "*"  # any cluster's hash tag (and, for per-VM keys, the VM after it)
LOCK = f"{KEY_LOCK}:{_CLUSTER}"
FENCE = f"{KEY_FENCE}:{_CLUSTER}"
GENERATION = f"{KEY_GENERATION}:{_CLUSTER}"
RESYNC = f"{KEY_RESYNC}:{_CLUSTER}"
PENDING = f"{KEY_PENDING}:{_CLUSTER}"
PENDING_VERSION = f"{KEY_PENDING_VERSION}:{_CLUSTER}"
STATE_VERSION = f"{KEY_STATE_VERSION}:{_CLUSTER}"
STATE_HOSTS = f"{KEY_STATE_HOSTS}:{_CLUSTER}"
STATE_VMS = f"{KEY_STATE_VMS}:{_CLUSTER}"
STATE_CLUSTER = f"{KEY_STATE_CLUSTER}:{_CLUSTER}"
STATE_CHANGES = f"{KEY_STATE_CHANGES}:{_CLUSTER}"
STATE_REMOVED = f"{KEY_STATE_REMOVED}:{_CLUSTER}"
CLUSTERS = KEY_CLUSTERS
DECISION = f"{KEY_DECISION}:{_CLUSTER}"
DECISION_HISTORY = f"{KEY_DECISION_HISTORY}:{_CLUSTER}"
COOLDOWN = f"{KEY_COOLDOWN}:{_CLUSTER}"
TRIED = f"{KEY_TRIED}:{_CLUSTER}"
HA_STATE = f"{KEY_HA_STATE}:{_CLUSTER}"
MAINTENANCE = f"{KEY_MAINTENANCE}:{_CLUSTER}"
MIGRATION_BUDGET = f"{KEY_MIGRATION_BUDGET}:{_CLUSTER}"
UNITS_INDEX = f"{KEY_UNITS_INDEX}:{UNITS_TAG}"
ALL_UNITS = f"{KEY_UNITS}:{UNITS_TAG}:*"


def _lease(role: str) -> str:
    return f"{KEY_LEASE}:{role}:{_CLUSTER}"


def _units_of(service: str) -> str:
    """The catalogue keys of one service's instances (vmsched.store.catalogues)."""
    return f"{KEY_UNITS}:{UNITS_TAG}:{service}:*"


#: What a reader of the cluster state through StateCache touches (table, catch-up, snapshot).
_STATE_READ = (STATE_VERSION, STATE_HOSTS, STATE_CLUSTER, STATE_CHANGES)
_STATE_ALL = (STATE_VERSION, STATE_HOSTS, STATE_VMS, STATE_CLUSTER, STATE_CHANGES, STATE_REMOVED)

# ---------------------------------------------------------------- commands
#: Every service and administrator: readiness and the pool's health checks (PING), the database of
#: the URL (SELECT, only sent for a database other than 0), scripts (EVALSHA, SCRIPT LOAD after a
#: NOSCRIPT).
_BASE = ("ping", "select", "evalsha", "script|load")
#: Every service: the stores read and write in MULTI/EXEC pipelines.
_TRANSACTIONS = ("multi", "exec", "discard")
#: Every service announces its policy units (vmsched.store.catalogues: the announce script, the
#: withdrawal at stop).
_ANNOUNCE = ("time", "set", "pexpire", "pttl", "zadd", "zremrangebyscore", "del", "zrem")
#: The generation check inside the lock's, the state writer's and the markers' scripts.
_GENERATION = ("get", "info|server")
#: StateCache: the current version, a full load (MULTI GET HGETALL) and the catch-up script.
_STATE_CACHE = ("get", "hgetall", "xrange", "hmget")
#: What a Redis Cluster client sends besides the keys' commands.
CLUSTER_COMMANDS: Final = ("cluster|slots", "command", "asking")
#: CLIENT SETINFO, which redis-py sends on connect (known to Redis 7.2 and later).
SETINFO_COMMANDS: Final = ("client|setinfo",)


@dataclass(frozen=True)
class Access:
    """One role's keys (patterns after "<prefix>:") and commands."""

    #: Keys the role writes (read-write).
    write: tuple[str, ...]
    #: Keys the role only reads (read-only).
    read: tuple[str, ...]
    commands: tuple[str, ...]


def _access(write: Sequence[str], read: Sequence[str], *commands: Sequence[str]) -> Access:
    cmds = sorted({c for group in (_BASE, *commands) for c in group})
    return Access(tuple(write), tuple(r for r in read if r not in write), tuple(cmds))


def _service(role: str, write: Sequence[str], read: Sequence[str], *commands: Sequence[str]) -> Access:
    """A service kind: what it says plus announcing its own units."""
    return _access([*write, _units_of(role), UNITS_INDEX], read, _TRANSACTIONS, _ANNOUNCE, *commands)


#: Each role's access, as vmsched.store and its callers use Redis (module docstring).
ACCESS: Final[Mapping[str, Access]] = {
    # The request lifecycle (vmsched.lifecycle): the cluster lock and its fence (ClusterLock, whose
    # acquire script checks the generation), a new generation when Redis forgot (vmsched.recovery:
    # the marker and the resync flag), pending records (PendingStore), decisions and their history
    # (DecisionStore), and the state through StateCache, with the VMs' records for the replay check;
    # the units every running worker announced (vmsched.lifecycle.routes: which workers get a policy).
    "selector": _service(
        "selector",
        [LOCK, FENCE, GENERATION, RESYNC, PENDING, PENDING_VERSION, DECISION, DECISION_HISTORY],
        [*_STATE_READ, STATE_VMS, ALL_UNITS],
        _GENERATION,
        _STATE_CACHE,
        ("incr", "hset", "hget", "hdel", "exists", "type", "zcard", "zremrangebyrank", "zrevrange"),
        ("zrange", "mget"),
    ),
    # StateCache only: the hosts' table at a request's version.
    "filter-worker": _service("filter-worker", [], _STATE_READ, _STATE_CACHE),
    "weigher": _service("weigher", [], _STATE_READ, _STATE_CACHE),
    # LeasedLoop: the clusters set, its leases, the generation markers (read); ClusterReader: pending
    # (expired records dropped on the way), the state; failed hosts (read) and cool-downs; the
    # maintenance plans it carries out (MaintenancePlans: HGETALL, HSET, HDEL); the disruption
    # budgets' record of its migrations (MigrationBudget).
    "balancer": _service(
        "balancer",
        [_lease(LEASE_BALANCER), PENDING, PENDING_VERSION, COOLDOWN, MAINTENANCE, MIGRATION_BUDGET],
        [CLUSTERS, GENERATION, RESYNC, *_STATE_READ, STATE_VMS, TRIED],
        _GENERATION,
        _STATE_CACHE,
        ("smembers", "mget", "hget", "hdel", "incr", "hset", "zrangebyscore"),
    ),
    # LeasedLoop as the balancer's; pending then the state snapshot; its remembered failing hosts.
    "ha-monitor": _service(
        "ha-monitor",
        [_lease(LEASE_HA_MONITOR), PENDING, PENDING_VERSION, HA_STATE],
        [CLUSTERS, GENERATION, RESYNC, STATE_VERSION, STATE_HOSTS, STATE_VMS, STATE_CLUSTER],
        _GENERATION,
        ("smembers", "hgetall", "hget", "hdel", "incr"),
    ),
    # StateWriter (the state, the clusters set, the generation after a loss, the resync flag),
    # pending records cleared and forgotten, failed hosts, a removed cluster's HA status, the gauges;
    # the stored decisions for `decisions.recent` and `decisions.get` (the history's script drops
    # expired ids from it, as the CLI's `decisions` does).
    "state-tracker": _service(
        "state-tracker",
        [*_STATE_ALL, CLUSTERS, GENERATION, RESYNC, PENDING, PENDING_VERSION, TRIED, HA_STATE, DECISION_HISTORY],
        [DECISION],
        _GENERATION,
        # INCRBY: redis-py's incr() sends INCRBY key 1 (PendingStore.forget); the scripts send INCR.
        ("hgetall", "hset", "hdel", "hget", "hlen", "hvals", "incr", "incrby", "xadd", "xrevrange", "sadd", "srem"),
        ("smembers",),
        ("type", "hmget", "zrevrange", "zrem"),
    ),
    # The units every running instance announced (UnitCatalogues.instances), before accepting policies.
    "policy-admin": _service("policy-admin", [], [ALL_UNITS], ("zrange", "mget")),
    # The `vmsched` CLI's direct reads: `decisions` (the history, whose script drops expired ids from
    # it), `explain` (one decision), `clusters list` (the clusters set). Everything else an operator
    # does goes through the services (RPCs on the admin exchange).
    ADMIN: _access(
        [DECISION_HISTORY],
        [DECISION, CLUSTERS],
        ("type", "get", "hmget", "zrevrange", "zrem", "smembers"),
    ),
}

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
#: What a Redis glob treats specially; a prefix's own are escaped so its keys match literally.
_GLOB = re.compile(r"([*?\[\]\\])")


def _check_prefix(prefix: str) -> str:
    Keys(prefix)  # empty, or with braces: refused with its reason
    if any(ch.isspace() for ch in prefix):
        raise ValueError(f"the Redis key prefix must not contain whitespace: {prefix!r}")
    return _GLOB.sub(r"\\\1", prefix)


def password_hash(password: str) -> str:
    """The SHA-256 (hex) Redis keeps of a password; a password given as `#<64 hex>` is already one."""
    if password.startswith("#") and _SHA256_HEX.fullmatch(password[1:]):
        return password[1:]
    if not password:
        raise ValueError("an empty Redis password; give each role a password of its own")
    return hashlib.sha256(password.encode()).hexdigest()


def permissions(
    role: str, prefix: str = "vmsched", *, cluster: bool = False, client_setinfo: bool = False
) -> list[str]:
    """The ACL rules of `role`'s user after its password: no channels, its commands, its keys
    (read-write, then read-only), and the selector that lets EVALSHA name any of them."""
    if role not in ACCESS:
        if role in NO_REDIS_ROLES:
            raise ValueError(f"the {role} has no Redis user: it talks to the bus only")
        raise ValueError(f"unknown role {role!r}; roles with a Redis user: {', '.join(REDIS_ROLES)}")
    access = ACCESS[role]
    base = _check_prefix(prefix)
    commands = [*access.commands, *(CLUSTER_COMMANDS if cluster else ()), *(SETINFO_COMMANDS if client_setinfo else ())]
    rules = ["resetchannels", "-@all", *(f"+{c}" for c in commands)]
    rules += [f"~{base}:{k}" for k in access.write]
    rules += [f"%R~{base}:{k}" for k in access.read]
    # EVALSHA needs every key it names read-write, read-only ones and a mix alike: the selector
    # grants that to EVALSHA alone, and the script's own commands are still checked against the rules above.
    rules.append("(" + " ".join(["+evalsha", *(f"~{base}:{k}" for k in (*access.write, *access.read))]) + ")")
    return rules


@dataclass(frozen=True)
class RedisUser:
    """One role's Redis user: its name, its password's SHA-256, its rules (`permissions`)."""

    role: str
    name: str
    password_sha256: str
    rules: tuple[str, ...]

    def setuser_args(self) -> list[str]:
        """The arguments of `ACL SETUSER`: reset first, so applying again takes away what was dropped."""
        return [self.name, "reset", "on", f"#{self.password_sha256}", *self.rules]

    def aclfile_line(self) -> str:
        return " ".join(["user", self.name, "on", f"#{self.password_sha256}", *self.rules])


def users(
    passwords: Mapping[str, str],
    prefix: str = "vmsched",
    *,
    roles: Sequence[str] = REDIS_ROLES,
    cluster: bool = False,
    client_setinfo: bool = False,
) -> list[RedisUser]:
    """The Redis users of `roles` (every role with one, by default) under the key `prefix`, each
    with its password from `passwords` (role -> password in clear or `#<sha256 hex>`)."""
    missing = [r for r in roles if not passwords.get(r)]
    if missing:
        raise ValueError(f"no Redis password for {', '.join(missing)}: give each role a password of its own")
    return [
        RedisUser(
            role=role,
            name=user_name(role),
            password_sha256=password_hash(passwords[role]),
            rules=tuple(permissions(role, prefix, cluster=cluster, client_setinfo=client_setinfo)),
        )
        for role in roles
    ]


#: The default user off, with no password and no rights: an aclfile without a `user default` line
#: would give it every right with no password.
DEFAULT_OFF: Final = ("default", "reset", "off", "resetpass", "resetkeys", "resetchannels", "-@all")


def aclfile(redis_users: Sequence[RedisUser], *, disable_default: bool = True) -> str:
    """The aclfile (`aclfile` in redis.conf) defining `redis_users`, and the default user off unless
    `disable_default` is False. The file admits no comments; the operator adds a line for their own
    administrative user (`user ops on #<sha256> ~* &* +@all`), or nobody can administer the server."""
    lines = [u.aclfile_line() for u in redis_users]
    if disable_default:
        lines.append(" ".join(["user", DEFAULT_OFF[0], *DEFAULT_OFF[2:]]))
    return "\n".join(lines) + "\n"


async def apply(
    redis: aioredis.Redis | RedisCluster, redis_users: Sequence[RedisUser], *, disable_default: bool = False
) -> None:
    """Create or replace each user on the server `redis` is connected to (on every node, primaries
    and replicas, with a Redis Cluster client), delete the users roles without Redis access may have
    from before, and with `disable_default` switch the default user off last (connections already
    open stay signed in, this one included).

    ACL SETUSER changes the running server only: with an aclfile, `ACL SAVE` keeps the users across
    restarts; without one, `CONFIG REWRITE` writes them to redis.conf. ACLs are not replicated: on
    Sentinel, apply on the primary and on every replica.
    """
    # redis-py sends ACL commands to one node of a cluster unless given the nodes (as a list: given
    # the ALL_NODES flag, it still looks for a key in ACL SETUSER's arguments and fails).
    nodes = (await redis.initialize()).get_nodes() if isinstance(redis, RedisCluster) else None
    commands = [("SETUSER", *user.setuser_args()) for user in redis_users] + [
        ("DELUSER", user_name(role)) for role in NO_REDIS_ROLES
    ]
    if disable_default:
        commands.append(("SETUSER", *DEFAULT_OFF))
    for command in commands:
        where = {"target_nodes": nodes} if nodes is not None else {}
        await redis.execute_command("ACL", *command, **where)


def access_table(prefix: str = "vmsched") -> str:
    """Each role's keys and commands as a Markdown table (docs/security.md)."""
    base = prefix
    rows = ["| role (user) | read-write keys | read-only keys | commands |", "|---|---|---|---|"]
    for role in REDIS_ROLES:
        a = ACCESS[role]
        rw = "<br>".join(f"`{base}:{k}`" for k in a.write) or "-"
        ro = "<br>".join(f"`{base}:{k}`" for k in a.read) or "-"
        # A `|` in a table cell ends the cell, even between backticks, unless escaped.
        commands = " ".join(f"`{c}`".replace("|", "\\|") for c in a.commands)
        rows.append(f"| {role} (`{user_name(role)}`) | {rw} | {ro} | {commands} |")
    rows += [f"| {role} | no Redis user | | |" for role in NO_REDIS_ROLES]
    return "\n".join(rows) + "\n"


__all__ = [
    "ACCESS",
    "CLUSTER_COMMANDS",
    "DEFAULT_OFF",
    "NO_REDIS_ROLES",
    "REDIS_ROLES",
    "SETINFO_COMMANDS",
    "Access",
    "RedisUser",
    "access_table",
    "aclfile",
    "apply",
    "password_hash",
    "permissions",
    "users",
]
