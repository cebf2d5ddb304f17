"""A connection that cannot be made is named for what it is, within seconds, for every server: the
login refused, rights refused, nothing listening, another kind of server at the address (private
servers: a Redis with a password, the RabbitMQ node with its users; the shared servers are only
pointed at, never changed)."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import AsyncIterator

import pytest

from tests.factories import Certificates
from vmsched.bus import connect as connect_bus
from vmsched.bus.amqp.failures import diagnose as diagnose_amqp
from vmsched.db import connect as connect_pg
from vmsched.errors import BusUnavailable, DatabaseUnavailable, RedisUnavailable
from vmsched.settings import Settings
from vmsched.store import connect
from vmsched.store.redis_failures import check_at_start
from vmsched.store.redis_failures import diagnose as diagnose_redis
from vmsched_services.tools.servers.base import free_port
from vmsched_services.tools.servers.rabbit import RabbitNode
from vmsched_services.tools.servers.redis import PrivateRedis

pytestmark = pytest.mark.integration

#: "Within a few seconds": the bound every failure here is named within.
NAMED_WITHIN_S = 15.0


@pytest.fixture(scope="module")
async def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[PrivateRedis]:
    server = PrivateRedis(tmp_path_factory.mktemp("redis-auth"), password="right")
    await server.start()
    yield server
    await server.kill()


async def _bus_failure(cfg: Settings) -> BusUnavailable:
    started = time.monotonic()
    with pytest.raises(BusUnavailable) as failed:
        async with connect_bus(cfg):
            pass
    assert time.monotonic() - started < NAMED_WITHIN_S
    return failed.value


async def _redis_failure(cfg: Settings) -> RedisUnavailable:
    client = connect(cfg)
    started = time.monotonic()
    try:
        with pytest.raises(RedisUnavailable) as failed:
            await check_at_start(client, cfg)
    finally:
        await client.aclose()
    assert time.monotonic() - started < NAMED_WITHIN_S
    return failed.value


# ------------------------------------------------------------------------------------- wrong password
async def test_a_wrong_redis_password_is_named_and_stops_the_start(
    settings: Settings, redis_with_password: PrivateRedis
) -> None:
    wrong = redis_with_password.url.replace(":right@", ":wrong@")
    failed = await _redis_failure(settings.model_copy(update={"redis_url": wrong}))
    assert failed.kind == "login_refused"
    assert "refused the login" in str(failed)
    assert "wrong" not in str(failed)  # the password is never said
    assert "VMSCHED_REDIS_URL" in (failed.hint or "")


async def test_the_right_redis_password_works(settings: Settings, redis_with_password: PrivateRedis) -> None:
    client = connect(settings.model_copy(update={"redis_url": redis_with_password.url}))
    try:
        assert await check_at_start(client, settings) is None
    finally:
        await client.aclose()


async def test_a_wrong_rabbitmq_password_is_named(settings: Settings, private_rabbit: RabbitNode) -> None:
    url = f"amqp://alice:wrong@127.0.0.1:{private_rabbit.port}/"
    failed = await _bus_failure(settings.model_copy(update={"amqp_url": url}))
    assert failed.kind == "login_refused"
    assert "refused the login of user 'alice'" in str(failed)
    assert "wrong" not in str(failed)
    assert "unreachable" not in str(failed)


# ------------------------------------------------------------------------------------ rights refused
@pytest.mark.parametrize(("user", "says"), [("bob", "virtual host '/'"), ("carol", "exchanges or queues")])
async def test_rabbitmq_refusing_rights_is_named(
    settings: Settings, private_rabbit: RabbitNode, user: str, says: str
) -> None:
    # bob has no rights on "/" (the broker refuses the virtual host); carol may configure nothing
    # (the broker refuses declaring the exchanges).
    url = f"amqp://{user}:right@127.0.0.1:{private_rabbit.port}/"
    failed = await _bus_failure(settings.model_copy(update={"amqp_url": url}))
    assert failed.kind == "permission_refused", str(failed)
    assert says in str(failed)
    assert "rabbitmqctl set_permissions" in (failed.hint or "")


# -------------------------------------------------------------------------------- nothing listening
async def test_nothing_listening_is_named_for_every_server(settings: Settings) -> None:
    port = free_port()
    bus = await _bus_failure(settings.model_copy(update={"amqp_url": f"amqp://guest:guest@127.0.0.1:{port}/"}))
    cfg = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"})
    client = connect(cfg)
    try:
        # Named but not raised: Redis merely away does not stop a start (the process waits for it).
        redis = await check_at_start(client, cfg)
    finally:
        await client.aclose()
    assert redis is not None
    with pytest.raises(DatabaseUnavailable) as pg:
        await connect_pg(f"postgresql://postgres@127.0.0.1:{port}/vmsched")
    for failed in (bus, redis, pg.value):
        assert failed.kind == "no_server"
        assert f"nothing listens at 127.0.0.1:{port} (connection refused)" in str(failed)
    assert not redis.needs_action


# ------------------------------------------------------------------------------ wrong kind of server
async def test_a_postgres_url_at_a_redis_port_is_named_within_seconds(
    settings: Settings, redis_with_password: PrivateRedis
) -> None:
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as failed:
        await connect_pg(f"postgresql://postgres@127.0.0.1:{redis_with_password.port}/vmsched")
    assert time.monotonic() - started < NAMED_WITHIN_S
    assert failed.value.kind == "wrong_server"
    assert f"VMSCHED_POSTGRES_URL points at 127.0.0.1:{redis_with_password.port}, where Redis answers" in str(
        failed.value
    )


async def test_an_amqp_url_at_a_redis_port_is_named(settings: Settings, redis_with_password: PrivateRedis) -> None:
    url = f"amqp://guest:guest@127.0.0.1:{redis_with_password.port}/"
    failed = await _bus_failure(settings.model_copy(update={"amqp_url": url, "rpc_timeout_s": 3.0}))
    assert failed.kind == "wrong_server"
    assert "where Redis answers, not RabbitMQ" in str(failed)


async def test_a_redis_url_at_the_postgres_port_is_named(settings: Settings) -> None:
    failed = await _redis_failure(settings.model_copy(update={"redis_url": "redis://127.0.0.1:5432/0"}))
    assert failed.kind == "wrong_server"
    assert "where PostgreSQL answers, not Redis" in str(failed)


async def test_a_plain_amqp_url_at_a_tls_port_says_to_ask_for_tls(
    settings: Settings, private_rabbit: RabbitNode
) -> None:
    url = private_rabbit.tls_url.replace("amqps://", "amqp://")
    failed = await _bus_failure(settings.model_copy(update={"amqp_url": url, "rpc_timeout_s": 3.0}))
    assert failed.kind == "tls_refused"
    assert "speaks TLS" in str(failed)


def test_a_tls_refusal_the_client_saw_only_as_a_reset_is_still_named_tls(
    settings: Settings, private_rabbit: RabbitNode, certs: Certificates
) -> None:
    # Under TLS 1.3 the broker's refusal of a missing client certificate can reach the client as a
    # reset connection rather than the alert: the diagnosis shakes hands again to read the alert.
    cfg = settings.model_copy(update={"amqp_tls_ca_file": str(certs.ca)})
    failed = diagnose_amqp(cfg, private_rabbit.tls_url, ConnectionResetError("Connection reset by peer"))
    assert failed.kind == "tls_refused"
    assert "wants a client certificate" in str(failed)


#: A fatal TLS alert record (protocol_version), what a TLS server sends for bytes that are not TLS.
PROTOCOL_VERSION_ALERT = bytes([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46])
#: The first byte of a TLS handshake record (a ClientHello).
HANDSHAKE_RECORD = bytes([0x16])


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("plain", ["alert", "reset"])
def test_a_server_that_drops_the_connection_right_after_the_handshake_refused_our_certificate(
    settings: Settings, certs: Certificates, how: str, plain: str
) -> None:
    """Under TLS 1.3 the refusal of a missing client certificate can reach the client as a reset or
    a bare close once the handshake is done, its alert never read: a server that took us would wait
    for our first bytes, so the diagnosis names the certificate, not "no TLS here" nor nothing; also
    when the server answers the probe's plain greetings with a reset rather than an alert (the
    greetings' unread bytes make its close a reset, which can beat its alert)."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(certs.server_cert, certs.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # the test closed the listener
                return
            try:
                if conn.recv(1, socket.MSG_PEEK) != HANDSHAKE_RECORD:
                    # Bytes that are not TLS (the probe's greetings): an alert, as TLS servers answer,
                    # or a bare reset, as one can look when the alert is lost.
                    if plain == "alert":
                        conn.sendall(PROTOCOL_VERSION_ALERT)
                    else:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    conn.close()
                    continue
                tls = server.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                continue
            if how == "reset":  # SO_LINGER 0: the close sends a reset
                tls.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            tls.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        cfg = settings.model_copy(
            update={"redis_url": f"rediss://127.0.0.1:{port}/0", "redis_tls_ca_file": str(certs.ca)}
        )
        found = diagnose_redis(cfg, ConnectionResetError("Connection reset by peer"))
    finally:
        listener.close()
        thread.join(5)
    assert found.kind == "tls_refused"
    assert "wants a client certificate" in str(found)
    assert "VMSCHED_REDIS_TLS_CERT_FILE" in (found.hint or "")
