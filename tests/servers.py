"""Where the integration tests find RabbitMQ, Redis and PostgreSQL.

The configured URLs (VMSCHED_AMQP_URL, VMSCHED_REDIS_URL, VMSCHED_POSTGRES_URL, defaulting to the
local servers) are used when they answer. Only when none is configured explicitly, a server does not
answer, and a Docker engine runs, testcontainers starts one (the optional path; `pip install
.[containers]`). Otherwise the run stops with an error that names the server: integration tests are
never skipped silently.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from vmsched.settings import Settings


@dataclass
class Servers:
    amqp_url: str
    redis_url: str
    postgres_url: str
    containers: list[object]


def amqp_user(url: str) -> str:
    """The RabbitMQ user an AMQP URL connects as (the broker's default, guest, when it names none):
    the identity the broker vouches for on what that connection sends (AMQP user_id)."""
    return urlsplit(url).username or "guest"


def _answers(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), 1.0):
            return True
    except OSError:
        return False


def _docker_runs() -> bool:
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415 - optional, untyped

        docker.from_env().ping()
        return True
    except Exception:
        return False


def resolve() -> Servers:
    base = Settings()
    urls = {"amqp": base.amqp_url, "redis": base.redis_url, "postgres": base.postgres_url}
    ports = {"amqp": 5672, "redis": 6379, "postgres": 5432}
    containers: list[object] = []
    for name, url in list(urls.items()):
        if _answers(url, ports[name]):
            continue
        configured = f"VMSCHED_{name.upper()}_URL" in os.environ
        if configured or not _docker_runs():
            raise RuntimeError(
                f"{name} does not answer at {url}: start it (see README, 'The servers') "
                f"or set VMSCHED_{name.upper()}_URL"
            )
        urls[name] = _start_container(name, containers)
    return Servers(urls["amqp"], urls["redis"], urls["postgres"], containers)


def _start_container(name: str, containers: list[object]) -> str:
    # Imported lazily: testcontainers is an optional extra, only for machines with Docker.
    if name == "amqp":
        from testcontainers.rabbitmq import RabbitMqContainer  # noqa: PLC0415 - optional extra

        c = RabbitMqContainer("rabbitmq:3.13-management").start()
        containers.append(c)
        return f"amqp://guest:guest@{c.get_container_host_ip()}:{c.get_exposed_port(5672)}/"
    if name == "redis":
        from testcontainers.redis import RedisContainer  # noqa: PLC0415 - optional extra

        r = RedisContainer("redis:7").start()
        containers.append(r)
        return f"redis://{r.get_container_host_ip()}:{r.get_exposed_port(6379)}/0"
    from testcontainers.postgres import PostgresContainer  # noqa: PLC0415 - optional extra

    p = PostgresContainer("postgres:16", driver=None).start()
    containers.append(p)
    url: str = p.get_connection_url()
    return url
