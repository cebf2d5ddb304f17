"""A deployment's credentials directory: one generated password per role and server, the
definitions each server takes, and each role's connection URLs, all written 0600 under a 0700
directory.

    DIR/passwords/<server>/<role>     the clear password (kept across runs: generating again only
                                      fills in what is missing, or what --rotate names)
    DIR/rabbitmq/definitions.json     RabbitMQ users (hashed), permissions and topology
    DIR/redis/users.acl               Redis ACL users (hashed)
    DIR/postgres/roles.sql            PostgreSQL roles (SCRAM verifiers) and their grants
    DIR/<role>/<server>_url           the URL a role connects with (VMSCHED_<SERVER>_URL_FILE)
    DIR/<role>/env                    the role's other settings (no secret in it)
    DIR/ops/<server>_url              the operator's own administrative login on each server
                                      (RabbitMQ administrator, Redis `vmsched-ops`, PostgreSQL's
                                      owner `postgres`), for migrations, `security apply` and repairs
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from vmsched import constants as c
from vmsched.settings import Settings
from vmsched_services.tools.security import postgres_roles, rabbit_defs, redis_acl
from vmsched_services.tools.security.roles import ADMIN, API, ENGINE, ROLES, SERVICE_ROLES, pg_role_name, user_name

#: The operator's user on RabbitMQ and Redis.
OPS_USER = "vmsched-ops"

#: The servers each role connects to (the engine only talks to the bus).
SERVERS: dict[str, tuple[str, ...]] = {
    **{role: ("amqp", "redis", "postgres") for role in SERVICE_ROLES},
    ENGINE: ("amqp",),
    # Some operator commands read Redis directly (decisions, explain, clusters list).
    ADMIN: ("amqp", "redis"),
    # The HTTP API holds no state: it talks to the bus only.
    API: ("amqp",),
}
#: The operator: not a part of vmsched but whoever administers its servers (see the module docstring).
OPS = "ops"
#: The PostgreSQL superuser / database owner the operator logs in as (the postgres image's).
PG_OWNER = "postgres"
#: Bytes of randomness per generated password (URL-safe base64: 32 characters).
PASSWORD_BYTES = 24


@dataclass(frozen=True)
class Endpoints:
    """Where the servers are, as the roles will reach them (host:port, scheme)."""

    amqp: str = "127.0.0.1:5672"
    redis: str = "127.0.0.1:6379"
    postgres: str = "127.0.0.1:5432"
    database: str = "vmsched"
    amqp_tls: bool = False
    redis_tls: bool = False
    postgres_sslmode: str = "prefer"
    vhost: str = "/"
    redis_db: int = 0

    def url(self, server: str, user: str, password: str) -> str:
        secret = f"{quote(user, safe='')}:{quote(password, safe='')}"
        if server == "amqp":
            scheme = "amqps" if self.amqp_tls else "amqp"
            return f"{scheme}://{secret}@{self.amqp}/{quote(self.vhost, safe='')}"
        if server == "redis":
            scheme = "rediss" if self.redis_tls else "redis"
            return f"{scheme}://{secret}@{self.redis}/{self.redis_db}"
        return f"postgresql://{secret}@{self.postgres}/{self.database}?sslmode={self.postgres_sslmode}"


@dataclass
class Credentials:
    """The passwords of one deployment, by server and role."""

    directory: Path
    passwords: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path, *, rotate: Iterable[str] = ()) -> Credentials:
        """The passwords under `directory`, generating those missing and those of the roles in `rotate`."""
        rotated = set(rotate)
        unknown = rotated - {*ROLES, OPS}
        if unknown:
            raise ValueError(f"unknown role(s) {sorted(unknown)}; roles: {', '.join(ROLES)}")
        creds = cls(directory)
        (directory / "passwords").mkdir(mode=0o700, parents=True, exist_ok=True)
        (directory / "passwords").chmod(0o700)
        for role, servers in {**SERVERS, OPS: ("amqp", "redis", "postgres")}.items():
            for server in servers:
                path = directory / "passwords" / server / role
                if path.exists() and role not in rotated:
                    password = path.read_text(encoding="utf-8").strip()
                else:
                    password = secrets.token_urlsafe(PASSWORD_BYTES)
                    _write_secret(path, password)
                creds.passwords.setdefault(server, {})[role] = password
        return creds

    def of(self, server: str) -> Mapping[str, str]:
        return self.passwords.get(server, {})


def write_all(directory: Path, settings: Settings, endpoints: Endpoints, *, rotate: Iterable[str] = ()) -> Credentials:
    """Generate (or complete) the credentials directory; see the module docstring."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    creds = Credentials.load(directory, rotate=rotate)
    amqp, redis, postgres = creds.of("amqp"), creds.of("redis"), creds.of("postgres")
    definitions = rabbit_defs.definitions(settings, amqp)
    definitions["users"].append(rabbit_defs.operator_user(OPS_USER, amqp[OPS]))
    definitions["permissions"].append(rabbit_defs.operator_permissions(OPS_USER, rabbit_defs.vhost_of(settings)))
    _write_secret(directory / "rabbitmq" / "definitions.json", json.dumps(definitions, indent=2))
    acl = redis_acl.aclfile(redis_acl.users(redis, settings.redis_prefix))
    ops_line = f"user {OPS_USER} on #{redis_acl.password_hash(redis[OPS])} ~* &* +@all\n"
    _write_secret(directory / "redis" / "users.acl", ops_line + acl)
    _write_secret(directory / "postgres" / "roles.sql", postgres_roles.roles_sql(postgres, database=endpoints.database))
    for role, servers in SERVERS.items():
        for server in servers:
            user = pg_role_name(role) if server == "postgres" else user_name(role)
            _write_secret(directory / role / f"{server}_url", endpoints.url(server, user, creds.of(server)[role]))
        _write_secret(directory / role / "env", role_environment(role))
    for server, user in (("amqp", OPS_USER), ("redis", OPS_USER), ("postgres", PG_OWNER)):
        _write_secret(directory / OPS / f"{server}_url", endpoints.url(server, user, creds.of(server)[OPS]))
    # The servers' images read the owner's password from a file of its own.
    _write_secret(directory / "postgres" / "owner_password", postgres[OPS])
    return creds


def role_environment(role: str) -> str:
    """The settings (not secret) a role runs with under these definitions."""
    lines = ["VMSCHED_AMQP_DECLARE=false"]
    if role == ENGINE:
        lines.append(f"VMSCHED_AMQP_EVENTS_QUEUE={c.ENGINE_EVENTS_QUEUE}")
    # The HTTP API's user administers for its admin tokens; policy-admin records each such write
    # as "vmsched-api for NAME", taking the api's word for NAME (VMSCHED_API_USERS) and nobody else's.
    lines.append(f"VMSCHED_ADMIN_USERS={user_name(ADMIN)},{user_name(API)}")
    lines.append(f"VMSCHED_API_USERS={user_name(API)}")
    return "\n".join(lines) + "\n"


def _write_secret(path: Path, text: str) -> None:
    """Write `text` readable by its owner only (created so, never briefly world-readable)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    path.chmod(0o600)


__all__ = ["OPS", "OPS_USER", "PG_OWNER", "SERVERS", "Credentials", "Endpoints", "role_environment", "write_all"]
