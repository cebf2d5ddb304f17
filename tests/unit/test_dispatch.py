"""The shared dispatcher (vmsched.bus.dispatch): every delivery ends acked or rejected exactly once.

The transport here is a recording fake of the broker primitives (it is the unit under test's
boundary, not a stand-in for RabbitMQ: tests/integration/test_bus.py runs the same dispatcher on
the real broker). Hypothesis throws hostile bodies, hostile handlers and failing primitives at it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import structlog
import structlog.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vmsched import constants as c
from vmsched.bus.codec import ERROR_MESSAGE_MAX, decode, encode, error_reply
from vmsched.bus.dispatch import (
    HEADER_ATTEMPTS,
    HEADER_DEADLINE,
    HEADER_ORIGINAL_SIZE,
    HEADER_TRUNCATED,
    MESSAGE_DEADLINE,
    Delivery,
    Dispatcher,
    Transport,
)
from vmsched.contracts import (
    ClusterReport,
    ErrorReply,
    FilterReply,
    FilterRequest,
    HostReport,
    HostStatus,
    Message,
    PolicyChanged,
    StateRequest,
    UnitCall,
    VmReport,
    VmSpec,
)
from vmsched.errors import (
    DatabaseMissing,
    InvalidProperty,
    InvalidRequest,
    RedisUnavailable,
    SchedulingError,
    UnknownCluster,
    VmschedError,
)
from vmsched.scheduling.units.base import validate_properties
from vmsched.scheduling.units.registry import get_unit
from vmsched.settings import Settings

SETTINGS = Settings(
    transient_retry_delay_s=0, transient_attempts=3, max_message_bytes=64 * 1024, dead_letter_max_body_bytes=4096
)
SECRET = "role-vmsched_owner-password-hunter2"


class Broken(Exception):
    """An exception whose text cannot even be read."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


class WeirdCode(VmschedError):
    code = "not a valid code!"


class RecordingTransport(Transport):
    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.failing = failing
        self.calls: list[str] = []  # every primitive called, in order, "ok" or "failed"
        self.replies: list[tuple[bytes, str, bool]] = []
        self.dead: list[tuple[bytes, dict[str, Any]]] = []
        self.retries: list[dict[str, Any]] = []

    async def _step(self, name: str) -> None:
        if name in self.failing:
            self.calls.append(f"{name}:failed")
            raise ConnectionError(f"{name} refused by the broker")
        self.calls.append(f"{name}:ok")

    async def reply(self, body: bytes, *, type_: str, error: bool) -> None:
        await self._step("reply")
        self.replies.append((body, type_, error))

    async def dead_letter(self, body: bytes, headers: dict[str, Any]) -> None:
        await self._step("dead_letter")
        self.dead.append((body, headers))

    async def retry(self, headers: dict[str, Any]) -> None:
        await self._step("retry")
        self.retries.append(headers)

    async def ack(self) -> None:
        await self._step("ack")

    async def reject(self) -> None:
        await self._step("reject")

    def settlements(self) -> list[str]:
        return [call for call in self.calls if call.split(":")[0] in ("ack", "reject")]


def assert_settled_once(t: RecordingTransport, reply_to: str | None = None) -> None:
    """Exactly one ack or reject, last. An ack only after what had to be published was published:
    a request with a reply address was answered (or dead-lettered, or put back for a retry), and
    every failed publish was made good by a confirmed dead-letter copy."""
    settled = t.settlements()
    assert len(settled) == 1, t.calls
    assert t.calls[-1] == settled[0], t.calls
    if settled[0].startswith("ack"):
        if reply_to is not None:
            assert {"reply:ok", "dead_letter:ok", "retry:ok"} & set(t.calls), t.calls
        if any(call.endswith(":failed") for call in t.calls[:-1]):
            assert "dead_letter:ok" in t.calls, t.calls
    for body, _, error in t.replies:
        if error:
            reply = decode(body, ErrorReply)  # always a valid ErrorReply, however long the error was
            assert len(reply.message) <= ERROR_MESSAGE_MAX
            assert SECRET not in reply.message


def filter_request(properties: dict[str, str] | None = None) -> FilterRequest:
    # model_construct: a hostile engine sends whatever JSON it likes, so the test builds the unit
    # call without the client-side validation that would refuse an oversized property value.
    call = UnitCall.model_construct(unit="CPUOverloaded", properties=properties or {})
    return FilterRequest(
        request_id=uuid.uuid4(),
        cluster_id="c1",
        state_version=1,
        vm=VmSpec(vm_id="vm1", mem_mb=1024, vcpus=1),
        candidates=["h1"],
        filters=[call],
    )


async def validating_handler(request: FilterRequest) -> FilterReply:
    """What the filter-worker does first with a request's filters: check each unit's properties."""
    for call in request.filters:
        validate_properties(get_unit(call.unit), call.properties)
    return FilterReply(request_id=request.request_id, survivors=request.candidates, removed=[])


def run(coro: Awaitable[str]) -> str:
    async def main() -> str:
        return await coro

    return asyncio.run(main())


# ---------------------------------------------------------------------------------------- strategies
def _deep(n: int) -> bytes:
    return ("[" * n + "]" * n).encode()


BODIES = st.one_of(
    st.binary(max_size=512),
    st.text(max_size=200).map(str.encode),
    st.integers(min_value=1, max_value=20_000).map(_deep),
    st.integers(min_value=0, max_value=100_000).map(lambda n: json.dumps({"cluster_id": "x" * n}).encode()),
    st.integers(min_value=0, max_value=20_000).map(
        lambda n: encode(filter_request({"HighUtilization": "9" * n}))  # valid model, hostile property value
    ),
    st.just(encode(filter_request())),
    st.just(encode(StateRequest(cluster_id="c1"))),
    st.just(b"x" * (SETTINGS.max_message_bytes + 1)),
)


def _raise(exc: BaseException) -> Callable[[FilterRequest], Awaitable[Message]]:
    async def handler(request: FilterRequest) -> Message:
        raise exc

    return handler


def _returns(value: object) -> Callable[[FilterRequest], Awaitable[Message]]:
    async def handler(request: FilterRequest) -> Message:
        return value  # type: ignore[return-value]  # deliberately whatever the test passes

    return handler


SIZES = st.integers(min_value=0, max_value=50_000)
HANDLERS = st.one_of(
    st.just(validating_handler),
    SIZES.map(lambda n: _raise(ValueError(SECRET + "v" * n))),
    SIZES.map(lambda n: _raise(SchedulingError("s" * n, location="l" * (n % 3000)))),
    SIZES.map(lambda n: _raise(InvalidProperty("CPUOverloaded", "HighUtilization", "9" * n, r"^([5-9][0-9])$"))),
    SIZES.map(lambda n: _raise(WeirdCode("w" * n))),
    st.just(_raise(Broken())),
    st.just(_raise(UnknownCluster("no such cluster"))),
    st.just(_raise(ConnectionError(f"redis at {SECRET} went away"))),
    st.just(_raise(TimeoutError())),
    st.just(_raise(RedisUnavailable("Redis cannot be reached"))),
    st.just(_raise(DatabaseMissing("no database"))),
    st.just(_returns(42)),
    st.just(_returns(None)),
)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        HEADER_ATTEMPTS: st.one_of(st.integers(-5, 10), st.text(max_size=5), st.booleans()),
        HEADER_DEADLINE: st.one_of(
            st.just(int(time.time() * 1000) + 3_600_000),
            st.just(int(time.time() * 1000) - 1000),
            st.text(max_size=5),
            st.floats(allow_nan=True),
        ),
    },
)
PRIMITIVES = st.frozensets(st.sampled_from(["reply", "dead_letter", "retry", "ack", "reject"]))


# ---------------------------------------------------------------------------------------- properties
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=BODIES,
    handler=HANDLERS,
    headers=HEADERS,
    failing=PRIMITIVES,
    reply_to=st.sampled_from([None, "amq.rabbitmq.reply-to.abc"]),
)
def test_every_request_is_settled_exactly_once(
    body: bytes,
    handler: Callable[[FilterRequest], Awaitable[Message]],
    headers: dict[str, Any],
    failing: frozenset[str],
    reply_to: str | None,
) -> None:
    t = RecordingTransport(failing)
    delivery = Delivery(queue="q", body=body, routing_key="filter", headers=headers, reply_to=reply_to)
    run(Dispatcher(SETTINGS, "filter-worker").request(delivery, t, FilterRequest, handler))
    assert_settled_once(t, reply_to)
    for copy, dl_headers in t.dead:
        assert len(copy) <= SETTINGS.dead_letter_max_body_bytes
        assert len(str(dl_headers[c.HEADER_DLX_REASON])) <= 2000


async def _failing_event_handler(event: Message) -> None:
    raise Broken()


EVENT_HANDLERS = st.one_of(
    st.just(_failing_event_handler),
    SIZES.map(lambda n: _raise(ValueError("e" * n))),
    st.just(_raise(ConnectionError("redis away"))),
    st.just(_raise(UnknownCluster("u"))),
    st.just(_returns(None)),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=BODIES,
    handler=EVENT_HANDLERS,
    headers=HEADERS,
    failing=PRIMITIVES,
    type_=st.sampled_from([None, "FilterRequest", "StateRequest", "Nope", "x" * 300]),
)
def test_every_event_is_settled_exactly_once(
    body: bytes,
    handler: Callable[[Any], Awaitable[None]],
    headers: dict[str, Any],
    failing: frozenset[str],
    type_: str | None,
) -> None:
    t = RecordingTransport(failing)
    delivery = Delivery(queue="events", body=body, routing_key="state.x", headers=headers, type=type_)
    models: dict[str, type[Message]] = {"FilterRequest": FilterRequest, "StateRequest": StateRequest}
    run(Dispatcher(SETTINGS, "state-tracker").event(delivery, t, models, handler))
    assert_settled_once(t)
    assert t.replies == []


# ---------------------------------------------------------------------------------------- examples
def test_huge_property_value_is_refused_at_decode_and_acked() -> None:
    """The poison message: a 9,000-character property value. It is refused by the message bounds
    before any unit sees it, with a short error naming the property."""
    t = RecordingTransport()
    request = filter_request({"HighUtilization": "9" * 9000})
    delivery = Delivery(queue="q", body=encode(request), reply_to="r")
    outcome = run(Dispatcher(SETTINGS, "filter-worker").request(delivery, t, FilterRequest, validating_handler))
    assert outcome == "invalid_request"
    assert t.calls[-1] == "ack:ok"
    assert "reply:ok" in t.calls
    reply = decode(t.replies[0][0], ErrorReply)
    assert reply.location == "filters.0.properties.HighUtilization"
    assert len(reply.message) < 1000


def test_handler_error_longer_than_an_error_reply_is_answered_cut_to_fit_and_acked() -> None:
    """What wedged workers: a rejection text longer than ErrorReply allows made building the reply raise."""
    t = RecordingTransport()
    delivery = Delivery(queue="q", body=encode(filter_request()), reply_to="r")
    huge = InvalidProperty("CPUOverloaded", "HighUtilization", "9" * 9000, "^[0-9]{1,2}$")
    outcome = run(Dispatcher(SETTINGS, "filter-worker").request(delivery, t, FilterRequest, _raise(huge)))
    assert outcome == "invalid_property"
    assert t.calls == ["reply:ok", "ack:ok"]
    reply = decode(t.replies[0][0], ErrorReply)
    assert reply.code == "invalid_property"
    assert reply.location == "properties.HighUtilization"
    assert len(reply.message) == ERROR_MESSAGE_MAX
    assert reply.message.startswith("property HighUtilization='9999")
    assert reply.message.endswith("more characters cut]")


def test_internal_error_reply_names_a_reference_not_the_exception() -> None:
    t = RecordingTransport()
    delivery = Delivery(queue="q", body=encode(filter_request()), reply_to="r")
    handler = _raise(RuntimeError(f"password authentication failed for user {SECRET}"))
    with structlog.testing.capture_logs() as logged:
        dispatcher = Dispatcher(SETTINGS, "selector")  # its logger binds inside the capture
        assert run(dispatcher.request(delivery, t, FilterRequest, handler)) == "internal"
    reply = decode(t.replies[0][0], ErrorReply)
    assert reply.code == "internal"
    assert SECRET not in reply.message
    assert reply.message.startswith("internal error in selector (reference ")
    ref = reply.message.split("(reference ")[1].split(")")[0]
    assert len(ref) == 12
    _, dl_headers = t.dead[0]
    assert f"reference {ref}" in dl_headers[c.HEADER_DLX_REASON]
    # The operator has the whole story, exception included, under the same reference.
    failures = [e for e in logged if e.get("reference") == ref]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "error"
    assert SECRET in failures[0]["error"]
    assert isinstance(failures[0]["exc_info"], RuntimeError)
    assert t.calls == ["reply:ok", "dead_letter:ok", "ack:ok"]


def test_domain_error_text_goes_back_as_it_is() -> None:
    t = RecordingTransport()
    delivery = Delivery(queue="q", body=encode(filter_request()), reply_to="r")
    handler = _raise(UnknownCluster("no state was ever reported for c1", location="cluster_id"))
    run(Dispatcher(SETTINGS, "filter-worker").request(delivery, t, FilterRequest, handler))
    reply = decode(t.replies[0][0], ErrorReply)
    assert (reply.code, reply.message, reply.location) == (
        "unknown_cluster",
        "no state was ever reported for c1",
        "cluster_id",
    )
    assert t.calls == ["reply:ok", "ack:ok"]  # a domain error is the caller's, not a dead letter


def test_transient_failure_is_retried_a_bounded_number_of_times_then_answered_retryable_not_internal() -> None:
    attempts: list[int] = []

    async def handler(request: FilterRequest) -> FilterReply:
        raise ConnectionError("Redis is restarting")

    async def main() -> list[RecordingTransport]:
        dispatcher = Dispatcher(SETTINGS, "filter-worker")
        delivery = Delivery(queue="q", body=encode(filter_request()), reply_to="r")
        seen: list[RecordingTransport] = []
        while True:  # play the broker: each retry copy is delivered again
            t = RecordingTransport()
            seen.append(t)
            attempts.append(delivery.attempts)
            await dispatcher.request(delivery, t, FilterRequest, handler)
            if not t.retries:
                return seen
            delivery = Delivery(queue="q", body=delivery.body, reply_to="r", headers=t.retries[0])
            assert len(seen) < 50, "retries must be bounded"

    seen = asyncio.run(main())
    assert attempts == list(range(SETTINGS.transient_attempts))
    for t in seen[:-1]:
        assert t.calls == ["retry:ok", "ack:ok"]
    last = seen[-1]
    # Its caller owns the next attempt: answered, not dead-lettered (a requeue would run it twice).
    assert last.calls == ["reply:ok", "ack:ok"]
    reply = decode(last.replies[0][0], ErrorReply)
    assert reply.code == "server_unavailable"
    assert f"tried {SETTINGS.transient_attempts} times" in reply.message


def test_dead_letter_body_above_the_threshold_is_kept_truncated_with_its_size() -> None:
    t = RecordingTransport()
    body = b"\xff" * (SETTINGS.dead_letter_max_body_bytes * 3)
    run(
        Dispatcher(SETTINGS, "filter-worker").request(
            Delivery(queue="q", body=body), t, FilterRequest, validating_handler
        )
    )
    copy, headers = t.dead[0]
    assert copy == body[: SETTINGS.dead_letter_max_body_bytes]
    assert headers[HEADER_ORIGINAL_SIZE] == len(body)
    assert headers[HEADER_TRUNCATED] is True
    assert "invalid FilterRequest" in headers[c.HEADER_DLX_REASON]


def test_small_dead_letter_body_is_kept_whole_without_truncation_headers() -> None:
    t = RecordingTransport()
    run(Dispatcher(SETTINGS, "w").request(Delivery(queue="q", body=b"{"), t, FilterRequest, validating_handler))
    copy, headers = t.dead[0]
    assert copy == b"{"
    assert HEADER_TRUNCATED not in headers
    assert HEADER_ORIGINAL_SIZE not in headers


def test_unpublishable_reply_and_dead_letter_end_in_a_reject() -> None:
    t = RecordingTransport(frozenset({"reply", "dead_letter"}))
    delivery = Delivery(queue="q", body=encode(filter_request()), reply_to="r")
    run(Dispatcher(SETTINGS, "w").request(delivery, t, FilterRequest, validating_handler))
    assert t.calls == ["reply:failed", "dead_letter:failed", "reject:ok"]


def test_late_request_is_dead_lettered_unhandled() -> None:
    handled: list[FilterRequest] = []

    async def handler(request: FilterRequest) -> FilterReply:
        handled.append(request)
        return FilterReply(request_id=request.request_id, survivors=[], removed=[])

    t = RecordingTransport()
    headers = {HEADER_DEADLINE: int(time.time() * 1000) - 1}
    delivery = Delivery(queue="q", body=encode(filter_request()), reply_to="r", headers=headers)
    assert run(Dispatcher(SETTINGS, "w").request(delivery, t, FilterRequest, handler)) == "expired"
    assert handled == []
    assert t.calls == ["dead_letter:ok", "ack:ok"]
    assert HEADER_DEADLINE not in t.dead[0][1]


def test_error_reply_helper_cuts_and_never_raises() -> None:
    reply = error_reply("bad code with spaces", Broken(), "x" * 10_000)
    assert reply.code == "internal"
    assert "cannot be shown" in reply.message
    assert reply.location is not None
    assert 490 <= len(reply.location) <= 500
    assert reply.location.endswith("more characters cut]")
    assert error_reply("invalid_request", InvalidRequest("short")).message == "short"


# ---------------------------------------------------------------------------------------- routing key vs body
STATE_QUEUE = "vmsched.state-tracker.events"
REPORTS: dict[str, type[Message]] = {"ClusterReport": ClusterReport, "HostReport": HostReport, "VmReport": VmReport}


def host_report(cluster_id: str) -> HostReport:
    return HostReport(
        cluster_id=cluster_id, host_id="h1", status=HostStatus.UP, cpu_cores=4, physical_mem_mb=1, mem_free_mb=1
    )


def deliver_report(
    report: Message, routing_key: str, handler: Callable[[Any], Awaitable[None]], **kw: Any
) -> tuple[str, RecordingTransport]:
    t = RecordingTransport()
    delivery = Delivery(
        queue=STATE_QUEUE, body=encode(report), routing_key=routing_key, type=type(report).__name__, **kw
    )
    outcome = run(Dispatcher(SETTINGS, "state-tracker").event(delivery, t, REPORTS, handler))
    return outcome, t


def test_an_event_whose_routing_key_names_another_cluster_is_dead_lettered_with_both() -> None:
    handled: list[Message] = []

    async def handler(event: Message) -> None:
        handled.append(event)

    outcome, t = deliver_report(host_report("c-body"), c.host_report_key("c-key"), handler)
    assert outcome == "invalid_request"
    assert handled == []
    assert t.calls == ["dead_letter:ok", "ack:ok"]
    reason = t.dead[0][1][c.HEADER_DLX_REASON]
    assert "'c-key'" in reason
    assert "'c-body'" in reason
    assert "'state.host.c-body'" in reason  # the key to publish it with
    assert t.dead[0][1][c.HEADER_DLX_ROUTING_KEY] == "state.host.c-key"


def test_an_event_on_another_kind_of_key_is_dead_lettered() -> None:
    async def handler(event: Message) -> None:
        raise AssertionError("not for the handler")

    outcome, t = deliver_report(host_report("c1"), c.vm_report_key("c1"), handler)
    assert outcome == "invalid_request"
    reason = t.dead[0][1][c.HEADER_DLX_REASON]
    assert "'state.vm.c1' is not a HostReport's" in reason
    assert "'state.host.c1'" in reason


@pytest.mark.parametrize("cluster", ["c1", "a.b", "x:y@z"])
def test_an_event_whose_routing_key_and_body_agree_is_handled(cluster: str) -> None:
    """Cluster ids may hold dots: the key is compared whole, not by its last word."""
    handled: list[Message] = []

    async def handler(event: Message) -> None:
        handled.append(event)

    for report, key in [
        (host_report(cluster), c.host_report_key(cluster)),
        (ClusterReport(cluster_id=cluster), c.cluster_report_key(cluster)),
    ]:
        outcome, t = deliver_report(report, key, handler)
        assert outcome == "ok"
        assert t.calls == ["ack:ok"]
    assert [e.cluster_id for e in handled] == [cluster, cluster]  # type: ignore[attr-defined]


def test_a_dotted_cluster_is_not_mistaken_for_a_shorter_one() -> None:
    async def handler(event: Message) -> None:
        raise AssertionError("not for the handler")

    outcome, t = deliver_report(host_report("b"), c.host_report_key("a.b"), handler)
    assert outcome == "invalid_request"
    assert "names cluster 'a.b' but the HostReport body names cluster 'b'" in t.dead[0][1][c.HEADER_DLX_REASON]


def test_events_without_a_cluster_key_are_not_checked() -> None:
    handled: list[Message] = []

    async def handler(event: Message) -> None:
        handled.append(event)

    t = RecordingTransport()
    event = PolicyChanged(cluster_id="c1")
    delivery = Delivery(queue="q", body=encode(event), routing_key=c.POLICY_CHANGED, type="PolicyChanged")
    assert run(Dispatcher(SETTINGS, "selector").event(delivery, t, {"PolicyChanged": PolicyChanged}, handler)) == "ok"
    assert handled == [event]


def test_a_retried_event_keeps_its_routing_key_through_the_default_exchange() -> None:
    """RabbitMQ delivers a retry copy with the queue's name as routing key: the first key rides in a header."""
    calls = 0

    async def flaky(event: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("Redis is restarting")

    report = host_report("c1")
    outcome, first = deliver_report(report, c.host_report_key("c1"), flaky)
    assert outcome == "transient"
    headers = first.retries[0]
    assert headers[c.HEADER_DLX_ROUTING_KEY] == c.host_report_key("c1")
    outcome, again = deliver_report(report, STATE_QUEUE, flaky, headers=headers)  # as the broker delivers it
    assert outcome == "ok"
    assert again.calls == ["ack:ok"]


def test_a_header_does_not_vouch_for_a_key_the_event_was_not_retried_under() -> None:
    async def handler(event: Message) -> None:
        raise AssertionError("not for the handler")

    outcome, t = deliver_report(
        host_report("c1"), c.host_report_key("c2"), handler, headers={c.HEADER_DLX_ROUTING_KEY: "state.host.c1"}
    )
    assert outcome == "invalid_request"
    assert t.calls == ["dead_letter:ok", "ack:ok"]


def test_a_handler_reads_its_messages_deadline_and_the_next_one_does_not_inherit_it() -> None:
    """MESSAGE_DEADLINE: the x-deadline-ms header, in unix seconds, while the handler runs (a
    filter-worker placing a big batch stops there); a message without one reads None."""
    seen: list[float | None] = []

    async def handler(request: FilterRequest) -> FilterReply:
        seen.append(MESSAGE_DEADLINE.get())
        return await validating_handler(request)

    at = int(time.time() * 1000) + 60_000
    dispatcher = Dispatcher(SETTINGS, "filter-worker")
    with_deadline = Delivery(queue="q", body=encode(filter_request()), reply_to="r", headers={HEADER_DEADLINE: at})
    without = Delivery(queue="q", body=encode(filter_request()), reply_to="r")

    async def both() -> list[str]:  # one after the other in one context, as a consumer runs them
        first = await dispatcher.request(with_deadline, RecordingTransport(), FilterRequest, handler)
        second = await dispatcher.request(without, RecordingTransport(), FilterRequest, handler)
        return [first, second]

    assert asyncio.run(both()) == ["ok", "ok"]
    assert seen == [at / 1000, None]
