"""TLS to each server, against private servers with TLS listeners and certificates made at test time.

For RabbitMQ, Redis and PostgreSQL alike: the right CA (and the client certificate the server wants)
gives a working connection, used for real (an RPC, a lock, a policy read); a wrong CA is refused with
a message naming the certificate check and the CA file; no client certificate is refused with a message
saying the server wants one. Each refusal is a `tls_refused` error, never the "start the server" one.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.factories import Certificates, first_generation
from vmsched.bus import connect as connect_bus
from vmsched.contracts import ClusterReport, ClusterState, StateRequest
from vmsched.db import PolicyRepository, migrate
from vmsched.db import connect as connect_pg
from vmsched.errors import BusUnavailable, DatabaseUnavailable, RedisUnavailable
from vmsched.reach import TlsFiles
from vmsched.settings import Settings
from vmsched.store import ClusterLock, connect
from vmsched.store.redis_failures import check_at_start
from vmsched_services.tools.servers.base import TlsListener
from vmsched_services.tools.servers.postgres import PrivatePostgres
from vmsched_services.tools.servers.rabbit import RabbitNode
from vmsched_services.tools.servers.redis import PrivateRedis

pytestmark = pytest.mark.integration


def _files(prefix: str, certs: Certificates, *, ca: Path | None = None, client: bool = True) -> dict[str, str]:
    """Settings for one server's TLS files: the CA (the right one unless told), the client certificate."""
    return {
        f"{prefix}_tls_ca_file": str(ca or certs.ca),
        f"{prefix}_tls_cert_file": str(certs.client_cert) if client else "",
        f"{prefix}_tls_key_file": str(certs.client_key) if client else "",
    }


# ---------------------------------------------------------------------------------------------- Redis
@pytest.fixture(scope="module")
async def tls_redis(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[PrivateRedis]:
    """Redis on a TLS port only, wanting client certificates (tls-auth-clients yes)."""
    tls = TlsListener(certs.server_cert, certs.server_key, certs.ca, client_cert_required=True)
    server = PrivateRedis(tmp_path_factory.mktemp("redis-tls"), tls=tls)
    await server.start()
    yield server
    await server.kill()


async def test_redis_over_tls_with_the_right_ca_and_client_certificate_takes_a_lock(
    settings: Settings, tls_redis: PrivateRedis, certs: Certificates, unique: str
) -> None:
    cfg = settings.model_copy(update={"redis_url": tls_redis.url, **_files("redis", certs)})
    client = connect(cfg)
    try:
        assert await check_at_start(client, cfg) is None
        locks = ClusterLock(client, cfg, recover=first_generation(client, cfg))
        async with locks.hold(f"tls-{unique}") as lease:
            assert (await locks.holder(f"tls-{unique}") or "").startswith(lease.owner)
        assert await locks.holder(f"tls-{unique}") is None
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("wrong CA", "the server's certificate did not verify"),
        ("no client certificate", "wants a client certificate"),
    ],
)
async def test_redis_over_tls_refuses_a_wrong_ca_or_no_client_certificate_by_name(
    settings: Settings, tls_redis: PrivateRedis, certs: Certificates, case: str, says: str
) -> None:
    files = _files("redis", certs, ca=certs.other_ca) if case == "wrong CA" else _files("redis", certs, client=False)
    cfg = settings.model_copy(update={"redis_url": tls_redis.url, **files})
    client = connect(cfg)
    try:
        with pytest.raises(RedisUnavailable) as refused:
            await check_at_start(client, cfg)
    finally:
        await client.aclose()
    assert refused.value.kind == "tls_refused"
    assert says in str(refused.value)
    if case == "wrong CA":
        assert str(certs.other_ca) in str(refused.value)  # the CA file that was used is named
    assert "VMSCHED_REDIS_TLS_" in (refused.value.hint or "")


# ----------------------------------------------------------------------------------------- PostgreSQL
@pytest.fixture(scope="module")
async def tls_postgres(certs: Certificates, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[PrivatePostgres]:
    """PostgreSQL with ssl=on, TCP over TLS only, client certificates wanted (clientcert=verify-ca)."""
    tls = TlsListener(certs.server_cert, certs.server_key, certs.ca, client_cert_required=True)
    server = PrivatePostgres(tmp_path_factory.mktemp("pg-tls"), tls=tls)
    await server.start()
    yield server
    await server.stop()
    server.remove()


async def test_postgres_over_tls_with_the_right_ca_and_client_certificate_reads_a_policy(
    tls_postgres: PrivatePostgres, certs: Certificates
) -> None:
    tls = TlsFiles("VMSCHED_POSTGRES_TLS", str(certs.ca), str(certs.client_cert), str(certs.client_key))
    await migrate(tls_postgres.dsn, tls=tls)
    pool = await connect_pg(tls_postgres.dsn, tls=tls)
    try:
        policy = await PolicyRepository(pool).get_default()
        assert policy.name
        assert await pool.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()") is True
    finally:
        await pool.close()


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("wrong CA", "the server's certificate did not verify"),
        ("no client certificate", "wants a client certificate"),
    ],
)
async def test_postgres_over_tls_refuses_a_wrong_ca_or_no_client_certificate_by_name(
    tls_postgres: PrivatePostgres, certs: Certificates, case: str, says: str
) -> None:
    if case == "wrong CA":
        tls = TlsFiles("VMSCHED_POSTGRES_TLS", str(certs.other_ca), str(certs.client_cert), str(certs.client_key))
    else:
        tls = TlsFiles("VMSCHED_POSTGRES_TLS", str(certs.ca))
    with pytest.raises(DatabaseUnavailable) as refused:
        await connect_pg(tls_postgres.dsn.replace("/vmsched", "/postgres"), tls=tls)
    assert refused.value.kind == "tls_refused"
    assert says in str(refused.value)
    if case == "wrong CA":
        assert str(certs.other_ca) in str(refused.value)


# ------------------------------------------------------------------------------------------- RabbitMQ
async def test_rabbitmq_over_tls_with_the_right_ca_and_client_certificate_answers_an_rpc(
    settings: Settings, private_rabbit: RabbitNode, certs: Certificates
) -> None:
    cfg = settings.model_copy(update={"amqp_url": private_rabbit.tls_url, **_files("amqp", certs)})
    route = f"tls-{uuid.uuid4().hex[:8]}"

    async def handle(request: StateRequest) -> ClusterState:
        return ClusterState(
            cluster_id=request.cluster_id, version=3, settings=ClusterReport(cluster_id="c1"), hosts=[], vms=[]
        )

    async with connect_bus(cfg, "state-tracker") as server, connect_bus(cfg) as client:
        await server.serve(route, StateRequest, handle)
        reply = await client.call(route, StateRequest(cluster_id="c1"), ClusterState)
    assert reply.version == 3


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("wrong CA", "the server's certificate did not verify"),
        ("no client certificate", "wants a client certificate"),
    ],
)
async def test_rabbitmq_over_tls_refuses_a_wrong_ca_or_no_client_certificate_by_name(
    settings: Settings, private_rabbit: RabbitNode, certs: Certificates, case: str, says: str
) -> None:
    files = _files("amqp", certs, ca=certs.other_ca) if case == "wrong CA" else _files("amqp", certs, client=False)
    cfg = settings.model_copy(update={"amqp_url": private_rabbit.tls_url, **files})
    with pytest.raises(BusUnavailable) as refused:
        async with connect_bus(cfg):
            pass
    assert refused.value.kind == "tls_refused"
    assert says in str(refused.value)
    if case == "wrong CA":
        assert str(certs.other_ca) in str(refused.value)
