"""Which failures are a server being away (retried, then answered with a retryable code naming the
server) and which are not (answered `internal` and dead-lettered): vmsched.store.redis.unavailable,
vmsched.db.pool.unavailable and the dispatcher that asks them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import ModuleType
from typing import Any

import pytest
import structlog
import structlog.testing
from asyncpg import exceptions as pg_errors
from redis import exceptions as redis_errors

from tests.factories import host_report
from vmsched import policy_cache
from vmsched.bus import MemoryBroker, MemoryBus
from vmsched.bus.codec import decode, encode
from vmsched.bus.dispatch import Delivery, Dispatcher, Transport
from vmsched.contracts import ClusterState, ErrorReply, HostReport, StateRequest
from vmsched.db.pool import unavailable as postgres_unavailable
from vmsched.errors import (
    DatabaseMissing,
    DatabaseUnavailable,
    PolicyStoreUnavailable,
    RedisUnavailable,
    RemoteError,
    ServerUnavailable,
    UnknownCluster,
)
from vmsched.policy_cache import PolicyStoreWatch
from vmsched.settings import Settings
from vmsched.store.redis import unavailable as redis_unavailable
from vmsched_services.tools.asyncapi.error_codes import error_codes
from vmsched_services.tools.failures import explain_failure, remote_hint

SETTINGS = Settings(transient_retry_delay_s=0, transient_attempts=3)

REDIS_AWAY = [
    redis_errors.ConnectionError("Error 111 connecting to 127.0.0.1:6390. Connection refused."),
    redis_errors.TimeoutError("Timeout reading from socket"),
    redis_errors.BusyLoadingError("Redis is loading the dataset in memory"),
    redis_errors.ReadOnlyError("You can't write against a read only replica."),
]
POSTGRES_AWAY = [
    pg_errors.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    pg_errors.CannotConnectNowError("the database system is starting up"),
    pg_errors.AdminShutdownError("terminating connection due to administrator command"),
    pg_errors.TooManyConnectionsError("sorry, too many clients already"),
    DatabaseUnavailable("PostgreSQL at 127.0.0.1:5432/vmsched is unreachable"),
]


@pytest.mark.parametrize("exc", REDIS_AWAY, ids=lambda e: type(e).__name__)
def test_redis_client_errors_of_a_server_away_are_redis_unavailable_naming_no_host(exc: Exception) -> None:
    found = redis_unavailable(exc)
    assert isinstance(found, RedisUnavailable)
    assert found.code == "redis_unavailable"
    assert found.retryable
    assert "127.0.0.1" not in found.message
    assert "6390" not in found.message


@pytest.mark.parametrize(
    "exc",
    [redis_errors.AuthenticationError("invalid password"), redis_errors.ResponseError("WRONGTYPE"), OSError("disk")],
    ids=lambda e: type(e).__name__,
)
def test_redis_errors_that_do_not_pass_by_themselves_are_not_redis_unavailable(exc: Exception) -> None:
    assert redis_unavailable(exc) is None


@pytest.mark.parametrize("exc", POSTGRES_AWAY, ids=lambda e: type(e).__name__)
def test_postgres_driver_errors_of_a_server_away_are_policy_store_unavailable_naming_no_host(exc: Exception) -> None:
    found = postgres_unavailable(exc)
    assert isinstance(found, PolicyStoreUnavailable)
    assert found.code == "policy_store_unavailable"
    assert found.retryable
    assert "PostgreSQL" in found.message
    assert "5432" not in found.message


def test_os_and_timeout_errors_are_postgres_away_only_when_they_came_out_of_a_postgres_call() -> None:
    for exc in (ConnectionRefusedError(111, "Connection refused"), TimeoutError()):
        assert postgres_unavailable(exc) is None
        assert isinstance(postgres_unavailable(exc, io=True), PolicyStoreUnavailable)


def test_a_missing_database_or_a_query_error_is_not_postgres_away() -> None:
    assert postgres_unavailable(DatabaseMissing("database vmsched does not exist")) is None
    assert postgres_unavailable(pg_errors.UndefinedTableError("relation policy does not exist")) is None


def test_every_new_code_is_listed_with_a_meaning_that_says_it_is_retryable() -> None:
    codes = error_codes()
    for code in ("server_unavailable", "redis_unavailable", "policy_store_unavailable", "database_unavailable"):
        assert codes[code].startswith("retryable")
        assert remote_hint(code) is not None


# ---------------------------------------------------------------------------------------- the dispatcher
class Recorder(Transport):
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.replies: list[bytes] = []
        self.retries: list[dict[str, Any]] = []

    async def reply(self, body: bytes, *, type_: str, error: bool) -> None:
        self.calls.append("reply")
        self.replies.append(body)

    async def dead_letter(self, body: bytes, headers: dict[str, Any]) -> None:
        self.calls.append("dead_letter")

    async def retry(self, headers: dict[str, Any]) -> None:
        self.calls.append("retry")
        self.retries.append(headers)

    async def ack(self) -> None:
        self.calls.append("ack")

    async def reject(self) -> None:
        self.calls.append("reject")


def _request() -> bytes:
    return encode(StateRequest(cluster_id="c1"))


def _until_answered(dispatcher: Dispatcher, exc: Exception) -> tuple[list[Recorder], ErrorReply | None]:
    """Play the broker: deliver each retry copy again, until the request is answered."""

    async def handler(_: StateRequest) -> ClusterState:
        raise exc

    async def main() -> list[Recorder]:
        delivery = Delivery(queue="q", body=_request(), reply_to="r")
        seen: list[Recorder] = []
        while len(seen) < 20:
            t = Recorder()
            seen.append(t)
            await dispatcher.request(delivery, t, StateRequest, handler)
            if not t.retries:
                break
            delivery = Delivery(queue="q", body=delivery.body, reply_to="r", headers=t.retries[0])
        return seen

    seen = asyncio.run(main())
    last = seen[-1].replies
    return seen, decode(last[0], ErrorReply) if last else None


def test_a_redis_outage_is_retried_then_answered_redis_unavailable_not_internal_nor_dead_lettered() -> None:
    dispatcher = Dispatcher(SETTINGS, "selector", [redis_unavailable, postgres_unavailable])
    seen, reply = _until_answered(dispatcher, REDIS_AWAY[0])
    assert len(seen) == SETTINGS.transient_attempts
    assert [t.calls for t in seen[:-1]] == [["retry", "ack"]] * (SETTINGS.transient_attempts - 1)
    assert seen[-1].calls == ["reply", "ack"]
    assert reply is not None
    assert reply.code == "redis_unavailable"
    assert "6390" not in reply.message


def test_a_driver_error_raised_from_inside_a_wrapper_is_still_recognised_by_its_cause() -> None:
    dispatcher = Dispatcher(SETTINGS, "selector", [redis_unavailable])
    try:
        try:
            raise REDIS_AWAY[1]
        except redis_errors.RedisError as exc:
            raise RuntimeError("reading the cluster state failed") from exc
    except RuntimeError as wrapped:
        _, reply = _until_answered(dispatcher, wrapped)
    assert reply is not None
    assert reply.code == "redis_unavailable"


def test_without_recognisers_a_redis_error_is_internal_which_is_why_the_runtime_hands_them_over() -> None:
    _, reply = _until_answered(Dispatcher(SETTINGS, "selector"), REDIS_AWAY[0])
    assert reply is not None
    assert reply.code == "internal"


def test_a_policy_store_outage_is_retried_then_answered_policy_store_unavailable() -> None:
    dispatcher = Dispatcher(SETTINGS, "policy-admin", [redis_unavailable, postgres_unavailable])
    seen, reply = _until_answered(dispatcher, POSTGRES_AWAY[0])
    assert len(seen) == SETTINGS.transient_attempts
    assert reply is not None
    assert reply.code == "policy_store_unavailable"
    assert "PostgreSQL" in reply.message


def test_a_domain_error_or_a_missing_database_is_answered_at_once() -> None:
    dispatcher = Dispatcher(SETTINGS, "selector", [redis_unavailable, postgres_unavailable])
    for exc, code in (
        (UnknownCluster("no state for c1"), "unknown_cluster"),
        (DatabaseMissing("no db"), "database_missing"),
    ):
        seen, reply = _until_answered(dispatcher, exc)
        assert len(seen) == 1
        assert reply is not None
        assert reply.code == code


def test_an_event_whose_handler_meets_a_server_away_is_retried_then_dead_lettered() -> None:
    dispatcher = Dispatcher(SETTINGS, "state-tracker", [redis_unavailable])
    event = host_report("c1", "h1", cpu_cores=4, physical_mem_mb=1, mem_free_mb=1)

    async def handler(_: HostReport) -> None:
        raise REDIS_AWAY[0]

    async def main() -> list[Recorder]:
        delivery = Delivery(queue="q", body=encode(event), type="HostReport", routing_key="state.host.c1")
        seen: list[Recorder] = []
        while len(seen) < 20:
            t = Recorder()
            seen.append(t)
            await dispatcher.event(delivery, t, {"HostReport": HostReport}, handler)
            if not t.retries:
                break
            delivery = Delivery(
                queue="q", body=delivery.body, type="HostReport", routing_key="state.host.c1", headers=t.retries[0]
            )
        return seen

    seen = asyncio.run(main())
    assert len(seen) == SETTINGS.transient_attempts
    assert seen[-1].calls == ["dead_letter", "ack"]  # nobody waits for an event: kept for a requeue


def test_server_unavailable_subclasses_say_whether_another_attempt_can_work() -> None:
    assert ServerUnavailable("x").retryable
    assert not DatabaseMissing("x").retryable


# ---------------------------------------------------------------------------------------- pausing consumers
def test_a_paused_bus_takes_no_request_another_instance_answers_and_resuming_takes_again() -> None:
    async def main() -> list[str]:
        broker = MemoryBroker()
        answered: list[str] = []

        def handler(name: str) -> Callable[[StateRequest], Awaitable[StateRequest]]:
            async def handle(req: StateRequest) -> StateRequest:  # an echo is reply enough here
                answered.append(name)
                return req

            return handle

        a, b, client = (MemoryBus(SETTINGS, broker, service=n) for n in ("a", "b", "client"))
        for bus in (a, b, client):
            await bus.start()
        await a.serve("state", StateRequest, handler("a"))
        await b.serve("state", StateRequest, handler("b"))
        await a.pause_consuming()
        for _ in range(6):
            await client.call("state", StateRequest(cluster_id="c1"), StateRequest, timeout=2)
        assert set(answered) == {"b"}
        answered.clear()
        await b.pause_consuming()
        await b.serve("state", StateRequest, handler("b-later"))  # made while paused: starts paused
        assert await a.resume_consuming()
        for _ in range(6):
            await client.call("state", StateRequest(cluster_id="c1"), StateRequest, timeout=2)
        for bus in (a, b, client):
            await bus.close()
        return answered

    assert set(asyncio.run(main())) == {"a"}


# ---------------------------------------------------------------------------------------- PostgreSQL away
def test_the_policy_store_watch_logs_once_each_way_and_counts_staleness_only_while_away(
    fresh_log: Callable[[ModuleType], None],
) -> None:
    watch = PolicyStoreWatch(retry_interval_s=3600)
    with structlog.testing.capture_logs() as logs:
        fresh_log(policy_cache)
        watch.answered()
        assert watch.staleness() == 0.0
        for _ in range(5):  # every request that meets the outage
            watch.trying()
            watch.failed(ConnectionRefusedError(111, "Connection refused"))
        assert watch.away
        assert watch.staleness() > 0.0
        assert not watch.worth_trying()  # tried a moment ago: requests do not queue behind reads bound to fail
        watch.answered()
        watch.answered()
    # One warning for the whole outage (the line saying it is back is info: below the tests' log level).
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert "PostgreSQL is away" in warnings[0]["event"]
    assert not watch.away
    assert watch.staleness() == 0.0
    assert watch.worth_trying()


def test_the_cli_says_postgres_is_away_and_how_to_start_it_when_policy_admin_answers_so() -> None:
    away = postgres_unavailable(POSTGRES_AWAY[0])
    assert away is not None
    told = explain_failure(RemoteError(away.code, f"{away.message} (tried 5 times by policy-admin)"), "policy-admin")
    assert told is not None
    assert told.message.startswith("policy_store_unavailable: PostgreSQL")
    assert told.hint is not None
    assert "PostgreSQL" in told.hint
    assert "start" in told.hint
    assert "Traceback" not in told.message + told.hint
