"""Secrets stay secret: the stack runs against private servers that need passwords (RabbitMQ with a
user of its own, Redis with requirepass, PostgreSQL with scram-sha-256 over TCP), some passwords
given in files (VMSCHED_<NAME>_FILE) and some in variables; it places VMs, applies a policy, refuses a
bad message, and `vmsched` runs commands that work and commands that fail (wrong passwords, servers
down). No password, right or wrong, may then appear in any service's output, any command's output,
/metrics, /readyz or the dead letters' headers."""

from __future__ import annotations

import asyncio
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import aio_pika
import asyncpg
import pytest
import yaml

from tests import factories
from tests.e2e.cli import vmsched
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.settings import Settings
from vmsched_services.tools.procs import ServiceStack
from vmsched_services.tools.servers.base import free_port
from vmsched_services.tools.servers.postgres import PrivatePostgres
from vmsched_services.tools.servers.rabbit import RabbitNode
from vmsched_services.tools.servers.redis import PrivateRedis

pytestmark = pytest.mark.e2e

TAG = secrets.token_hex(4)
#: The right passwords, distinctive enough that finding one anywhere is a leak, not a coincidence.
#: PostgreSQL's needs quoting in a URL: neither its raw nor its quoted form may show.
RIGHT = {
    "amqp": f"s3cret-amqp-{TAG}",
    "redis": f"s3cret-redis-{TAG}",
    "postgres": f"s3cret-pg@{TAG}",
    "sentinel": f"s3cret-sentinel-{TAG}",
    "failover": f"s3cret-failover-{TAG}",
}
#: Wrong passwords a user might type: secrets too.
WRONG = {"amqp": f"wr0ng-amqp-{TAG}", "redis": f"wr0ng-redis-{TAG}", "postgres": f"wr0ng-pg-{TAG}"}
FORBIDDEN = sorted({v for p in [*RIGHT.values(), *WRONG.values()] for v in (p, quote(p, safe=""))})
AMQP_USER = "vmsched"


@dataclass
class Servers:
    rabbit: RabbitNode
    redis: PrivateRedis
    postgres: PrivatePostgres

    def settings(self, **changes: object) -> Settings:
        amqp, redis, pg = RIGHT["amqp"], RIGHT["redis"], quote(RIGHT["postgres"], safe="")
        return Settings(
            amqp_url=f"amqp://{AMQP_USER}:{amqp}@127.0.0.1:{self.rabbit.port}/",
            # A node that is down, with a password of its own: never tried while the first answers.
            amqp_failover_urls=f"amqp://{AMQP_USER}:{RIGHT['failover']}@127.0.0.1:{free_port()}/",
            redis_url=f"redis://:{redis}@127.0.0.1:{self.redis.port}/0",
            postgres_url=f"postgresql://postgres:{pg}@127.0.0.1:{self.postgres.port}/vmsched",
            redis_sentinel_password=RIGHT["sentinel"],
            amqp_prefix=f"secrets-{TAG}.",
            admin_users=AMQP_USER,  # it applies a policy too
            log_level="INFO",  # more lines, more chances to leak
            **changes,  # type: ignore[arg-type]
        )


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    rabbit = RabbitNode(tmp_path / "rabbit", f"vmsched-secrets-{TAG}@localhost", secrets.token_hex(16).upper())
    redis = PrivateRedis(tmp_path / "redis", password=RIGHT["redis"])
    postgres = PrivatePostgres(tmp_path / "postgres", password=RIGHT["postgres"])
    try:
        await asyncio.gather(rabbit.start(), redis.start(), postgres.start())
        # guest stays loopback-only; the services log in as a user of their own.
        await rabbit.ctl("add_user", AMQP_USER, RIGHT["amqp"])
        await rabbit.ctl("set_permissions", "-p", "/", AMQP_USER, ".*", ".*", ".*")
        yield Servers(rabbit, redis, postgres)
    finally:
        await asyncio.gather(rabbit.stop(), redis.stop(), postgres.stop())
        rabbit.reap_group()
        postgres.remove()


@dataclass
class FileStack(ServiceStack):
    """The service processes' environment with some settings given as VMSCHED_<NAME>_FILE instead of
    VMSCHED_<NAME>, and variables of our own on top."""

    files: Mapping[str, Path] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        for variable, path in self.files.items():
            del env[variable]
            env[f"{variable}_FILE"] = str(path)
        return {**env, **self.extra}


def write_secret_files(settings: Settings, directory: Path) -> dict[str, Path]:
    """AMQP, PostgreSQL and the sentinel password in files (as `echo ... > file` writes them);
    Redis stays in its variable."""
    directory.mkdir()
    files = {}
    for name in ("amqp_url", "postgres_url", "redis_sentinel_password"):
        path = directory / name
        path.write_text(f"{getattr(settings, name)}\n")
        path.chmod(0o400)
        files[f"VMSCHED_{name.upper()}"] = path
    return files


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def wait_ready(port: int, timeout_s: float = 30.0) -> str:
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                status, body = await asyncio.to_thread(fetch, port, "/readyz")
            except OSError:  # not listening yet
                status, body = 0, ""
            if status == 200:
                return body
            await asyncio.sleep(0.2)


async def drop_every_connection(servers: Servers) -> None:
    """Each server closes the services' connections: they log the loss and reconnect."""
    await servers.rabbit.ctl("close_all_connections", "secrets test")
    client = servers.redis.client()
    try:
        await client.execute_command("CLIENT", "KILL", "TYPE", "normal")  # type: ignore[no-untyped-call]
    finally:
        await client.aclose()
    conn = await asyncpg.connect(servers.postgres.url("postgres"))
    try:
        await conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'vmsched'")
    finally:
        await conn.close()


async def refuse_a_bad_message(settings: Settings) -> None:
    """A state request that is not JSON: the state tracker dead-letters it and logs a warning."""
    conn = await aio_pika.connect(settings.amqp_url)
    try:
        ch = await conn.channel()
        ex = await ch.get_exchange(settings.amqp_prefix + c.RPC_EXCHANGE, ensure=False)
        await ex.publish(aio_pika.Message(b"{not json", content_type="application/json"), routing_key=c.RPC_STATE)
    finally:
        await conn.close()


async def dead_letters(env: Mapping[str, str], timeout_s: float = 20.0) -> tuple[int, str, str]:
    """`vmsched dead-letters list --json` once the refused message is there."""
    async with asyncio.timeout(timeout_s):
        while True:
            code, out, err = await vmsched(env, "dead-letters", "list", "--json")
            if code == 0 and json.loads(out):
                return code, out, err
            await asyncio.sleep(0.5)


def with_vars(env: Mapping[str, str], **variables: str) -> dict[str, str]:
    """`env` with VMSCHED_<NAME> variables set (and their _FILE twins removed); an AMQP URL without
    failover nodes."""
    variables = {"amqp_failover_urls": "", **variables} if "amqp_url" in variables else variables
    out = {k: v for k, v in env.items() if k.removesuffix("_FILE") not in {f"VMSCHED_{n.upper()}" for n in variables}}
    out.update({f"VMSCHED_{name.upper()}": value for name, value in variables.items()})
    return out


class Outputs(dict[str, str]):
    """What every command printed, by a name the failure message gives."""

    async def run(self, name: str, env: Mapping[str, str], *args: str, expect: int = 0) -> None:
        code, out, err = await vmsched(env, *args)
        self[f"{name}: stdout"], self[f"{name}: stderr"] = out, err
        assert code == expect, f"{name}: exit {code}\n{out}\n{err}"


async def place_refuse_and_reconnect(servers: Servers, settings: Settings, cluster: str, metrics_port: int) -> None:
    """VMs placed, a bad message refused, every connection dropped by its server; placed again."""
    async with SchedulerClient(settings) as client:
        await factories.make_cluster(client, cluster, 3, cpu_cores=8, physical_mem_mb=8192, mem_free_mb=8192)
        for i in range(3):
            assert (await client.schedule(cluster, factories.vm_spec(f"{cluster}-{i}", mem_mb=512, vcpus=1))).host_id
    await refuse_a_bad_message(settings)
    await drop_every_connection(servers)
    await wait_ready(metrics_port)
    async with SchedulerClient(settings) as client:  # the services are back
        assert (await client.schedule(cluster, factories.vm_spec(f"{cluster}-x", mem_mb=512, vcpus=1))).host_id


async def commands_that_fail(outputs: Outputs, servers: Servers, env: Mapping[str, str], cluster: str) -> None:
    """Wrong passwords and servers down, for commands and for a service; some with --debug."""
    s = servers.settings()
    bad_amqp = s.amqp_url.replace(RIGHT["amqp"], WRONG["amqp"])
    bad_redis = s.redis_url.replace(RIGHT["redis"], WRONG["redis"])
    bad_pg = s.postgres_url.replace(quote(RIGHT["postgres"], safe=""), WRONG["postgres"])
    down = f"127.0.0.1:{free_port()}"
    redis_down = s.redis_url.replace(f"127.0.0.1:{servers.redis.port}", down)
    amqp_down = s.amqp_url.replace(f"127.0.0.1:{servers.rabbit.port}", down)
    pg_down = s.postgres_url.replace(f"127.0.0.1:{servers.postgres.port}", down)
    run = outputs.run
    await asyncio.gather(
        run("wrong amqp password", with_vars(env, amqp_url=bad_amqp), "state", "--cluster", cluster, expect=3),
        run("wrong redis password", with_vars(env, redis_url=bad_redis), "decisions", "--cluster", cluster, expect=3),
        run("wrong pg password", with_vars(env, postgres_url=bad_pg), "--debug", "db", "migrate", expect=3),
        run("wrong pg password, --dsn", env, "db", "migrate", "--dsn", bad_pg, expect=3),
    )
    await asyncio.gather(
        run("redis down", with_vars(env, redis_url=redis_down), "clusters", "list", expect=3),
        run("amqp down", with_vars(env, amqp_url=amqp_down), "--debug", "policy", "list", expect=3),
        run("pg down", with_vars(env, postgres_url=pg_down), "db", "migrate", expect=3),
        run("service, wrong amqp password", with_vars(env, amqp_url=bad_amqp), "run", "selector", expect=3),
    )


async def test_no_password_appears_in_any_output(servers: Servers, tmp_path: Path, unique: str) -> None:
    metrics_port = free_port()
    settings = servers.settings()
    stack = FileStack(settings, tmp_path / "services", files=write_secret_files(settings, tmp_path / "secrets"))
    outputs = Outputs()
    env = stack.env
    await outputs.run("db migrate", env, "db", "migrate")
    cluster = f"sec-{unique}"
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(yaml.safe_dump({"clusters": [{"cluster_id": cluster, "policy": "none"}]}))
    try:
        stack.extra = {"VMSCHED_METRICS_PORT": str(metrics_port)}  # one process serves metrics
        stack.spawn("state-tracker")
        stack.extra = {}
        await stack.start("filter-worker", "weigher", "selector", "policy-admin")
        outputs["/readyz"] = await wait_ready(metrics_port)
        await place_refuse_and_reconnect(servers, settings, cluster, metrics_port)
        await asyncio.gather(
            outputs.run("policy apply", env, "policy", "apply", "-f", str(policy_file)),
            outputs.run("state", env, "state", "--cluster", cluster),
            outputs.run("decisions", env, "decisions", "--cluster", cluster),
            outputs.run("clusters list", env, "clusters", "list"),
        )
        await commands_that_fail(outputs, servers, env, cluster)
        outputs["dead-letters list: stdout"] = (await dead_letters(env))[1]
        await outputs.run("dead-letters show", env, "dead-letters", "show", "1", "--json")
        assert json.loads(outputs["dead-letters show: stdout"])["headers"], "the dead letter has headers"
        outputs["/metrics"] = (await asyncio.to_thread(fetch, metrics_port, "/metrics"))[1]
    finally:
        await stack.close()
    for proc in stack.procs:
        for path in (proc.stdout, proc.stderr):
            outputs[f"{proc.name}#{proc.index} {path.suffix}"] = path.read_text(errors="replace")

    leaks = [f"{where}: {secret}" for where, text in outputs.items() for secret in FORBIDDEN if secret in text]
    assert not leaks, "passwords in the output:\n  " + "\n  ".join(leaks)
    # What happened was logged, and the failures were told: there was something to leak.
    assert '"event": "message dead-lettered"' in outputs["state-tracker#0 .stderr"]
    assert "CONNECTION_FORCED" in outputs["selector#0 .stderr"]
    assert "vmsched_decisions_total" in outputs["/metrics"]
    for name in ("wrong amqp password", "wrong redis password", "wrong pg password", "service, wrong amqp password"):
        assert "refused the login" in outputs[f"{name}: stderr"], outputs[f"{name}: stderr"]
    for name in ("amqp down", "redis down", "pg down"):  # the URL named, without its password
        assert ":***@127.0.0.1:" in outputs[f"{name}: stderr"], outputs[f"{name}: stderr"]
