"""A deployment made the way deploy/compose.yml makes one, without Docker: `vmsched security init`
generates the credentials; RabbitMQ loads the definitions at boot, Redis starts from the aclfile,
PostgreSQL has its owner's password; `vmsched db migrate` and `vmsched security apply --postgres`
run as the owner; every service runs as a process of its own role, reading its URLs from the
role's files (VMSCHED_*_URL_FILE) and declaring nothing; the engine places a VM as vmsched-engine.
Then the CLI as administrator may read policies, and as the engine may not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.factories import host_report
from vmsched import constants as c
from vmsched.client import SchedulerClient
from vmsched.contracts import VmSpec
from vmsched.errors import NoConsumer, RemoteError
from vmsched.settings import Settings
from vmsched_services.tools.procs import service_command
from vmsched_services.tools.security.credentials import OPS
from vmsched_services.tools.security.roles import API, SERVICE_ROLES
from vmsched_services.tools.servers.base import free_port
from vmsched_services.tools.servers.postgres import PrivatePostgres
from vmsched_services.tools.servers.rabbit import RabbitNode
from vmsched_services.tools.servers.redis import PrivateRedis

pytestmark = [pytest.mark.e2e, pytest.mark.faults]

#: Per file of a role's directory, the setting that reads it.
URL_FILES = {"amqp_url": "VMSCHED_AMQP_URL_FILE", "redis_url": "VMSCHED_REDIS_URL_FILE",
             "postgres_url": "VMSCHED_POSTGRES_URL_FILE"}  # fmt: skip


@dataclass
class Deployment:
    credentials: Path
    logs: Path
    #: The api's port and an admin token of its tokens file (made by `vmsched api token add`).
    api_port: int = 0
    api_token: str = ""

    def env(self, role: str) -> dict[str, str]:
        """A process of `role`: its URL files and the role's settings, nothing else of vmsched's."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("VMSCHED_")}
        for name, variable in URL_FILES.items():
            path = self.credentials / role / name
            if path.exists():
                env[variable] = str(path)
        if role != OPS:
            for line in (self.credentials / role / "env").read_text().splitlines():
                key, _, value = line.partition("=")
                env[key] = value
        env |= {"VMSCHED_LOG_LEVEL": "WARNING", "VMSCHED_RPC_TIMEOUT_S": "5", "PYTHONUNBUFFERED": "1"}
        return env

    def vmsched(self, role: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "vmsched_services.tools.cli", *args],
            env=self.env(role),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    @property
    def api_tokens(self) -> Path:
        return self.credentials / API / "api_tokens"

    def settings(self, role: str) -> Settings:
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(self.env(role))
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deployment")


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return {"amqp": free_port(), "redis": free_port(), "postgres": free_port()}


@pytest.fixture(scope="module")
def creds(tmp: Path, ports: dict[str, int]) -> Path:
    """`vmsched security init` for servers at `ports`, as an operator would run it."""
    directory = tmp / "credentials"
    argv = ["security", "init", str(directory)]
    argv += ["--amqp", f"127.0.0.1:{ports['amqp']}", "--redis", f"127.0.0.1:{ports['redis']}"]
    argv += ["--postgres", f"127.0.0.1:{ports['postgres']}"]
    done = subprocess.run(
        [sys.executable, "-m", "vmsched_services.tools.cli", *argv],
        env={k: v for k, v in os.environ.items() if not k.startswith("VMSCHED_")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return directory


@pytest.fixture(scope="module")
async def deployment(tmp: Path, ports: dict[str, int], creds: Path) -> AsyncIterator[Deployment]:
    rabbit = RabbitNode(tmp / "rabbit", f"vmsched-deploy-{uuid.uuid4().hex[:6]}@localhost", uuid.uuid4().hex,
                        port=ports["amqp"])  # fmt: skip
    with (rabbit.directory / "rabbitmq.conf").open("a") as conf:  # as compose's configs: entry does
        conf.write(f"load_definitions = {creds / 'rabbitmq' / 'definitions.json'}\n")
    redis = PrivateRedis(tmp / "redis", ports["redis"], aclfile=creds / "redis" / "users.acl")
    owner = (creds / "postgres" / "owner_password").read_text().strip()
    postgres = PrivatePostgres(tmp / "pg", ports["postgres"], password=owner)
    async with contextlib.AsyncExitStack() as stack:
        for server in (rabbit, redis, postgres):
            await server.start()
            stack.push_async_callback(server.stop)
        d = Deployment(creds, tmp / "logs", api_port=free_port())
        for step in (["db", "migrate"], ["security", "apply", str(creds), "--postgres"]):
            done = await asyncio.to_thread(d.vmsched, OPS, *step)
            assert done.returncode == 0, done.stdout + done.stderr
        made = d.vmsched(OPS, "api", "token", "add", "alice", "--role", "admin", "--file", str(d.api_tokens))
        assert made.returncode == 0, made.stderr
        d.api_token = made.stdout.split()[-1]
        with services(d):
            yield d
        postgres.remove()


@contextlib.contextmanager
def services(d: Deployment) -> Iterator[None]:
    d.logs.mkdir(exist_ok=True)
    procs = []
    for role in (*SERVICE_ROLES, API):
        env = d.env(role)
        if role == API:
            env |= {"VMSCHED_API_PORT": str(d.api_port), "VMSCHED_API_TOKENS_FILE": str(d.api_tokens)}
        log = (d.logs / f"{role}.log").open("wb")
        procs.append(subprocess.Popen(service_command(role), env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


async def until_served(client: SchedulerClient, cluster: str, d: Deployment, timeout: float = 90.0) -> None:
    """Until a state tracker answers (the service processes take a while to start)."""
    end = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await client.state(cluster)
            return
        except RemoteError:
            return  # answered: it does not know the cluster yet
        except NoConsumer:
            if asyncio.get_running_loop().time() > end:
                logs = {p.name: p.read_text(errors="replace")[-1500:] for p in d.logs.glob("*.log")}
                raise AssertionError(f"no state tracker within {timeout:g} s: {logs}") from None
            await asyncio.sleep(0.5)


async def test_the_engine_places_a_vm_in_a_deployment_of_generated_credentials(deployment: Deployment) -> None:
    cluster = f"deploy-{uuid.uuid4().hex[:6]}"
    engine = deployment.settings("engine")
    assert not engine.amqp_declare
    assert engine.amqp_events_queue == c.ENGINE_EVENTS_QUEUE
    async with SchedulerClient(engine) as client:
        for i in range(3):
            await client.report_host(
                host_report(cluster, f"h{i}", cpu_cores=16, physical_mem_mb=65536, mem_free_mb=60000)
            )
        await until_served(client, cluster, deployment)
        await client.wait_for_state(cluster, hosts=3, timeout=60)
        decision = await client.schedule(cluster, VmSpec(vm_id="vm-1", mem_mb=2048, vcpus=2))
    assert decision.host_id in {"h0", "h1", "h2"}, decision
    logs = "".join(p.read_text(errors="replace") for p in deployment.logs.glob("*.log"))
    assert "NOPERM" not in logs
    assert "ACCESS_REFUSED" not in logs


def test_administration_serves_the_administrator_and_refuses_the_engine(deployment: Deployment) -> None:
    admin = deployment.vmsched("admin", "policy", "list")
    assert admin.returncode == 0, admin.stdout + admin.stderr
    assert "none" in admin.stdout
    engine = deployment.vmsched("engine", "policy", "list")
    assert engine.returncode != 0
    assert "RabbitMQ refused" in engine.stderr
    assert "Traceback" not in engine.stderr


async def test_the_api_runs_as_its_role_and_writes_on_behalf_of_the_tokens_person(deployment: Deployment) -> None:
    """The api with its own broker user (no Redis, no PostgreSQL): reads, and an administrator's
    write that policy-admin audits as "vmsched-api for alice"."""
    headers = {"Authorization": f"Bearer {deployment.api_token}"}
    name = f"via-api-{uuid.uuid4().hex[:6]}"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{deployment.api_port}", timeout=30) as http:
        for _ in range(180):  # the process takes a while to start
            with contextlib.suppress(httpx.TransportError):
                if (await http.get("/healthz")).status_code == 200:
                    break
            await asyncio.sleep(0.5)
        assert (await http.get("/api/v1/whoami", headers=headers)).json() == {"name": "alice", "role": "admin"}
        assert (await http.get("/api/v1/schedulingpolicies")).status_code == 401
        listed = await http.get("/api/v1/schedulingpolicies", headers=headers)
        assert listed.status_code == 200, listed.text
        cloned = await http.post("/api/v1/schedulingpolicies/none/clone", json={"name": name}, headers=headers)
        assert cloned.status_code == 201, cloned.text
    audit = deployment.vmsched("admin", "audit", "--json")
    assert audit.returncode == 0, audit.stderr
    entries = [e for e in json.loads(audit.stdout) if e["target"] == name]
    assert [(e["actor"], e["action"]) for e in entries] == [("vmsched-api for alice", "policy.cloned")]
