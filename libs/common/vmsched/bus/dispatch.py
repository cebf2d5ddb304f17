"""What happens to one delivered message, written once for every Bus.

A bus (AmqpBus, MemoryBus) turns a delivery into a `Delivery` and gives a `Transport`: the few
primitives that touch the broker (publish the reply, publish a dead-letter copy, put a copy back on
the queue for another attempt, ack, reject). `Dispatcher` decides everything else:

    deadline check -> decode -> handler -> reply and/or dead-letter copy -> ack

and guarantees that every delivery ends settled exactly once, whatever raises on the way:

* acked, only after its reply or its dead-letter copy (or its retry copy) was published; or
* rejected without requeue when a reply or a copy could not be published: the queue's
  x-dead-letter-exchange takes it, so a message that cannot even be dead-lettered by hand still
  leaves the queue instead of wedging a consumer's prefetch window for good.

The deadline is checked before decoding: a caller that gave up wants no answer, valid or not.
Error texts go back through `codec.error_reply` (cut to the reply's limits, never validated into an
exception). An unexpected exception goes back as code "internal" with a reference id only; its
text (which may name a database role or a host) stays in the service log under that reference.

A server a handler needs being away (Redis, PostgreSQL) is transient, not internal: the message is
tried again VMSCHED_TRANSIENT_ATTEMPTS times, and a request still failing then is answered with a
retryable error naming the server (`redis_unavailable`, `policy_store_unavailable`, ...), not
dead-lettered: its caller owns the next attempt. Which driver exceptions mean "away" is said by the
layers that own the drivers (vmsched.store.redis.unavailable, vmsched.db.pool.unavailable), handed
to the dispatcher by the wiring (`recognise`), so this module imports neither driver.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from vmsched import constants as c
from vmsched.bus.behalf import MESSAGE_ON_BEHALF_OF, named_in
from vmsched.bus.codec import decode, decode_any, encode, error_reply, safe_text, type_name
from vmsched.contracts import ErrorReply, Message
from vmsched.errors import InvalidRequest, ServerUnavailable, VmschedError
from vmsched.logging import get_logger
from vmsched.metrics import DEAD_LETTERS, HANDLE_SECONDS, MESSAGES
from vmsched.settings import Settings

#: Unix time in integer milliseconds. Not a float: AMQP tables may carry floats as 32-bit, which at
#: today's epoch is only 128 s precise and would put a deadline 10 s ahead into the past.
HEADER_DEADLINE = "x-deadline-ms"
#: How many times a message was already tried and failed transiently (set on its retry copies).
HEADER_ATTEMPTS = "x-vmsched-attempts"
#: A retry copy's original sender. A service republishes a retry as itself (RabbitMQ refuses any
#: other user_id), so the sender travels here, and is believed only on a copy the broker vouches the
#: receiving service's own user sent (amqp.consumers.delivery_of); a requeue drops it.
HEADER_SENDER = "x-vmsched-sender"
#: On a dead letter whose body was cut: the body's size before, and that it was cut.
HEADER_ORIGINAL_SIZE = "x-vmsched-original-size"
HEADER_TRUNCATED = "x-vmsched-truncated"
#: Bound on the reason kept in a dead letter's headers (AMQP headers are not for megabytes).
REASON_MAX = 2000
#: The deadline (unix seconds) of the request whose handler is running in this context, from its
#: x-deadline-ms header (None: it has none). Owned by Dispatcher.request, which sets it around each
#: handler call: a handler that works long (a filter-worker placing a big batch) stops when the
#: caller has given up instead of finishing work nobody reads.
MESSAGE_DEADLINE: ContextVar[float | None] = ContextVar("vmsched_message_deadline", default=None)
#: The sender of the message whose handler is running in this context: its AMQP user_id property,
#: which RabbitMQ refuses unless it names the user the sender connected as (None: the sender set
#: none). Owned by Dispatcher.request and Dispatcher.event, which set it around each handler call;
#: handlers that authorize (policy administration, removals) read it through `caller()`.
MESSAGE_USER: ContextVar[str | None] = ContextVar("vmsched_message_user", default=None)
#: Errors worth another attempt (a dependency such as Redis is briefly away) rather than a dead letter,
#: besides ServerUnavailable and what the recognisers say is one.
TRANSIENT = (ConnectionError, OSError, TimeoutError)
#: How far down an exception's `raise ... from` chain the recognisers look.
CAUSE_DEPTH = 8

#: Says which ServerUnavailable an exception means (None: not one); see the module docstring.
Recogniser = Callable[[BaseException], ServerUnavailable | None]


@dataclass(frozen=True)
class Delivery:
    """One delivered message, as the dispatcher needs it (no broker types)."""

    queue: str
    body: bytes
    routing_key: str = ""
    headers: Mapping[str, Any] = field(default_factory=dict)
    #: The exchange it was published to ("" for the default exchange: a retry copy).
    exchange: str = ""
    type: str | None = None
    reply_to: str | None = None
    correlation_id: str | None = None
    #: The AMQP user_id property: the user the broker vouches sent it (None: the sender set none).
    user_id: str | None = None

    @property
    def original_routing_key(self) -> str:
        """The routing key the message was published with. A retry copy goes back on its queue through
        the default exchange (so its routing key is the queue's name) and carries the first key in
        a header."""
        if self.routing_key == self.queue:
            original = self.headers.get(c.HEADER_DLX_ROUTING_KEY)
            if isinstance(original, bytes):
                original = original.decode("utf-8", "replace")
            if isinstance(original, str):
                return original
        return self.routing_key

    @property
    def original_exchange(self) -> str:
        """The exchange the message was published to; a retry copy (which came through the default
        exchange) carries the first one in a header."""
        if self.routing_key == self.queue:
            original = self.headers.get(c.HEADER_DLX_EXCHANGE)
            if isinstance(original, bytes):
                original = original.decode("utf-8", "replace")
            if isinstance(original, str):
                return original
        return self.exchange

    @property
    def attempts(self) -> int:
        """Transient failures already behind this message (0 on its first delivery)."""
        value = self.headers.get(HEADER_ATTEMPTS)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class Transport(ABC):
    """The broker side of one delivery. Each method raises if the broker did not take it."""

    @abstractmethod
    async def reply(self, body: bytes, *, type_: str, error: bool) -> None:
        """Publish the reply to the delivery's reply_to."""

    @abstractmethod
    async def dead_letter(self, body: bytes, headers: dict[str, Any]) -> None:
        """Publish a copy to the dead-letter exchange and wait for the broker's confirm."""

    @abstractmethod
    async def retry(self, headers: dict[str, Any]) -> None:
        """Publish a copy of the message, with these headers, back on its queue (confirmed)."""

    @abstractmethod
    async def ack(self) -> None: ...

    @abstractmethod
    async def reject(self) -> None:
        """basic.reject without requeue: the queue's dead-letter exchange takes the message."""


@dataclass
class _Verdict:
    """What to do with a delivery, decided before anything is published."""

    outcome: str
    reply: tuple[bytes, str, bool] | None = None  # body, type, is an ErrorReply
    dead_letter: str | None = None  # the reason
    transient: str | None = None  # the failure, when another attempt may succeed
    unavailable: ServerUnavailable | None = None  # the server a transient failure names, if known


def new_reference() -> str:
    """A short id naming one internal error in both the reply and the service log."""
    return uuid.uuid4().hex[:12]


def dead_letter_copy(
    delivery: Delivery, reason: str, service: str, max_body_bytes: int
) -> tuple[bytes, dict[str, Any]]:
    """The body and headers a dead letter is kept with: the reason, who refused it, where it was
    going (so `vmsched dead-letters requeue` can send it there again), when, and a bounded body."""
    headers = {k: v for k, v in delivery.headers.items() if k != HEADER_DEADLINE}
    headers.update(
        {
            c.HEADER_DLX_REASON: safe_text(reason, REASON_MAX),
            c.HEADER_DLX_SERVICE: service,
            c.HEADER_DLX_ROUTING_KEY: delivery.original_routing_key,
            c.HEADER_DLX_EXCHANGE: delivery.original_exchange,
            c.HEADER_DLX_TIME: int(time.time() * 1000),
            c.HEADER_DLX_ID: uuid.uuid4().hex[: c.DEAD_LETTER_ID_LENGTH],
        }
    )
    body = delivery.body
    if len(body) > max_body_bytes:
        # A 4 MB poison message kept whole, ten thousand times, is what filled the queue.
        headers[HEADER_ORIGINAL_SIZE] = len(body)
        headers[HEADER_TRUNCATED] = True
        body = body[:max_body_bytes]
    return body, headers


class Dispatcher:
    """Runs handlers for one bus; see the module docstring."""

    def __init__(self, settings: Settings, service: str, recognisers: Sequence[Recogniser] = ()) -> None:
        self.settings = settings
        self.service = service
        self.log = get_logger("vmsched.bus")
        self.recognisers: list[Recogniser] = list(recognisers)

    def recognise(self, *recognisers: Recogniser) -> None:
        """Also treat as transient what these say is a server being away."""
        self.recognisers.extend(r for r in recognisers if r not in self.recognisers)

    def unavailable(self, exc: BaseException) -> ServerUnavailable | None:
        """The retryable ServerUnavailable `exc` means (it or what it was raised from), else None.
        A bare ConnectionError, OSError or TimeoutError is one without a named server."""
        cause: BaseException | None = exc
        for _ in range(CAUSE_DEPTH):
            if cause is None:
                break
            if isinstance(cause, ServerUnavailable):
                return cause if cause.retryable else None
            for recognise in self.recognisers:
                found = recognise(cause)
                if found is not None:
                    return found
            cause = cause.__cause__
        if isinstance(exc, TRANSIENT):
            return ServerUnavailable(
                f"a server {self.service} needs cannot be reached ({type(exc).__name__}); send the request again later"
            )
        return None

    def _transient(self, exc: BaseException) -> _Verdict | None:
        unavailable = self.unavailable(exc)
        if unavailable is None:
            return None
        return _Verdict("transient", transient=_describe(exc), unavailable=unavailable)

    # ------------------------------------------------------------------ RPC
    async def request(
        self,
        delivery: Delivery,
        transport: Transport,
        request_type: type[Message],
        handler: Callable[[Any], Awaitable[Message]],
    ) -> str:
        """Handle one request; return its outcome (for metrics and tests). Never raises an Exception."""
        started = time.perf_counter()
        verdict = await self._judge_request(delivery, request_type, handler)
        await self._settle(delivery, transport, verdict)
        HANDLE_SECONDS.labels(delivery.queue).observe(time.perf_counter() - started)
        return verdict.outcome

    async def _judge_request(
        self, delivery: Delivery, request_type: type[Message], handler: Callable[[Any], Awaitable[Message]]
    ) -> _Verdict:
        try:
            deadline = delivery.headers.get(HEADER_DEADLINE)
            if isinstance(deadline, int) and not isinstance(deadline, bool) and time.time() * 1000 > deadline:
                # The caller has given up; working on it now would only waste a worker.
                return _Verdict("expired", dead_letter="deadline passed before a service took the request")
            try:
                request = decode(delivery.body, request_type, max_bytes=self.settings.max_message_bytes)
            except InvalidRequest as exc:
                return _Verdict("invalid_request", reply=self._error_body(exc), dead_letter=safe_text(exc, REASON_MAX))
            request_id = getattr(request, "request_id", None) or delivery.correlation_id
            given = deadline / 1000 if isinstance(deadline, int) and not isinstance(deadline, bool) else None
            with structlog.contextvars.bound_contextvars(queue=delivery.queue, request_id=str(request_id)):
                held, sender = MESSAGE_DEADLINE.set(given), MESSAGE_USER.set(delivery.user_id)
                behalf = MESSAGE_ON_BEHALF_OF.set(named_in(delivery.headers))
                try:
                    reply = await handler(request)
                    if not isinstance(reply, Message):
                        raise TypeError(f"handler returned {type(reply).__name__}, not a message model")
                    return _Verdict("ok", reply=(encode(reply), type_name(reply), False))
                except Exception as exc:
                    return self._handler_failed(delivery, exc)
                finally:
                    MESSAGE_DEADLINE.reset(held)
                    MESSAGE_USER.reset(sender)
                    MESSAGE_ON_BEHALF_OF.reset(behalf)
        except Exception as exc:
            # Only a hostile exception (one whose text cannot be read) gets here.
            return self._internal(delivery, exc, "request could not be handled")

    def _handler_failed(self, delivery: Delivery, exc: Exception) -> _Verdict:
        transient = self._transient(exc)
        if transient is not None:
            return transient
        if isinstance(exc, VmschedError):
            # The caller's own mistake (or a domain refusal): it gets the text back, cut to fit.
            return _Verdict(_code(exc), reply=self._error_body(exc))
        return self._internal(delivery, exc, "handler failed")

    def _internal(self, delivery: Delivery, exc: BaseException, what: str) -> _Verdict:
        ref = new_reference()
        self.log.error(what, queue=delivery.queue, reference=ref, error=_describe(exc), exc_info=exc)
        reply = error_reply("internal", f"internal error in {self.service} (reference {ref}); see the service log")
        return _Verdict(
            "internal",
            reply=(encode(reply), "ErrorReply", True),
            dead_letter=f"{what} (reference {ref}): {_describe(exc)}",
        )

    @staticmethod
    def _error_body(exc: VmschedError) -> tuple[bytes, str, bool]:
        reply: ErrorReply = error_reply(_code(exc), getattr(exc, "message", exc), getattr(exc, "location", None))
        return encode(reply), "ErrorReply", True

    # ------------------------------------------------------------------ events
    async def event(
        self,
        delivery: Delivery,
        transport: Transport,
        models: Mapping[str, type[Message]],
        handler: Callable[[Any], Awaitable[None]],
    ) -> str:
        """Handle one event; return its outcome. Never raises an Exception."""
        started = time.perf_counter()
        try:
            try:
                event = decode_any(delivery.body, delivery.type, models, max_bytes=self.settings.max_message_bytes)
                check_routing_key(delivery.original_routing_key, event)
                sender = MESSAGE_USER.set(delivery.user_id)
                try:
                    with structlog.contextvars.bound_contextvars(queue=delivery.queue):
                        await handler(event)
                finally:
                    MESSAGE_USER.reset(sender)
                verdict = _Verdict("ok")
            except Exception as exc:
                verdict = self._event_failed(delivery, exc)
        except Exception as exc:
            verdict = _Verdict("failed", dead_letter=f"event could not be handled: {_describe(exc)}")
        await self._settle(delivery, transport, verdict)
        HANDLE_SECONDS.labels(delivery.queue).observe(time.perf_counter() - started)
        return verdict.outcome

    def _event_failed(self, delivery: Delivery, exc: Exception) -> _Verdict:
        transient = self._transient(exc)
        if transient is not None:
            return transient
        if isinstance(exc, VmschedError):
            return _Verdict(_code(exc), dead_letter=safe_text(exc, REASON_MAX))
        self.log.error("event handler failed", queue=delivery.queue, error=_describe(exc), exc_info=exc)
        return _Verdict("failed", dead_letter=_describe(exc))

    # ------------------------------------------------------------------ settling
    async def _settle(self, delivery: Delivery, transport: Transport, verdict: _Verdict) -> None:
        try:
            await self._publish_and_ack(delivery, transport, verdict)
        except Exception as exc:  # a bug above must not leave the message unsettled
            self.log.error("settling a message failed", queue=delivery.queue, error=_describe(exc))
            await self._reject(delivery, transport)

    async def _publish_and_ack(self, delivery: Delivery, transport: Transport, verdict: _Verdict) -> None:
        if verdict.transient is not None:
            attempts = delivery.attempts + 1
            if attempts < self.settings.transient_attempts:
                self.log.warning(
                    "transient failure, trying again", queue=delivery.queue, attempt=attempts, error=verdict.transient
                )
                await asyncio.sleep(self.settings.transient_retry_delay_s * attempts)
                headers = {
                    **delivery.headers,
                    HEADER_ATTEMPTS: attempts,
                    c.HEADER_DLX_ROUTING_KEY: delivery.original_routing_key,
                    c.HEADER_DLX_EXCHANGE: delivery.original_exchange,
                }
                if not await self._try(delivery, "retry", transport.retry(headers)):
                    await self._reject(delivery, transport)
                    return
                MESSAGES.labels(delivery.queue, "retried").inc()
                await self._ack(delivery, transport)
                return
            verdict = self._given_up(delivery, verdict, attempts)
        if verdict.reply is not None and delivery.reply_to:
            body, type_, error = verdict.reply
            replied = await self._try(delivery, "reply", transport.reply(body, type_=type_, error=error))
            if not replied and verdict.dead_letter is None:
                # Acking needs proof the message went somewhere: a dead letter says why it got no answer.
                verdict = replace(verdict, dead_letter="the reply could not be published")
        if verdict.dead_letter is not None:
            body, headers = dead_letter_copy(
                delivery, verdict.dead_letter, self.service, self.settings.dead_letter_max_body_bytes
            )
            if not await self._try(delivery, "dead letter", transport.dead_letter(body, headers)):
                await self._reject(delivery, transport)
                return
            DEAD_LETTERS.labels(delivery.queue).inc()
            MESSAGES.labels(delivery.queue, "dead_lettered").inc()
            self.log.error(
                "message dead-lettered",
                queue=delivery.queue,
                reason=headers[c.HEADER_DLX_REASON],
                routing_key=delivery.routing_key,
            )
        else:
            MESSAGES.labels(delivery.queue, verdict.outcome).inc()
        await self._ack(delivery, transport)

    def _given_up(self, delivery: Delivery, verdict: _Verdict, attempts: int) -> _Verdict:
        """A transient failure on the last attempt: a request is answered with the retryable error
        naming the server (its caller owns the next attempt); an event, which nobody waits for, is
        dead-lettered so `vmsched dead-letters requeue` can send it again."""
        reason = f"transient failure on each of {attempts} attempts; the last: {verdict.transient}"
        if not delivery.reply_to:
            return replace(verdict, dead_letter=reason)
        self.log.warning("giving up on a request: a server is away", queue=delivery.queue, reason=reason)
        away = verdict.unavailable or ServerUnavailable(f"a server {self.service} needs cannot be reached")
        reply = error_reply(away.code, f"{away.message} (tried {attempts} times by {self.service})")
        return replace(verdict, outcome=away.code, reply=(encode(reply), "ErrorReply", True))

    async def _try(self, delivery: Delivery, what: str, step: Awaitable[None]) -> bool:
        try:
            await step
        except Exception as exc:
            self.log.warning(f"publishing the {what} failed", queue=delivery.queue, error=_describe(exc))
            return False
        return True

    async def _ack(self, delivery: Delivery, transport: Transport) -> None:
        try:
            await transport.ack()
        except Exception as exc:
            # The channel is gone: the broker requeues what was not acked. Rejecting now could not work either.
            self.log.warning(
                "ack failed; the broker will deliver the message again", queue=delivery.queue, error=_describe(exc)
            )

    async def _reject(self, delivery: Delivery, transport: Transport) -> None:
        MESSAGES.labels(delivery.queue, "rejected").inc()
        try:
            await transport.reject()
        except Exception as exc:
            self.log.warning(
                "reject failed; the broker will deliver the message again", queue=delivery.queue, error=_describe(exc)
            )


def caller() -> str | None:
    """The broker-vouched sender of the message being handled (see MESSAGE_USER)."""
    return MESSAGE_USER.get()


def check_routing_key(routing_key: str, event: Message) -> None:
    """Refuse (InvalidRequest) an event whose routing key is not "<its kind's prefix>.<its body's
    cluster_id>" (constants.CLUSTER_KEYED_EVENTS): a report filed under one cluster's key but
    describing another is a publisher's bug, and applying it would put a host in the wrong cluster."""
    type_ = type(event).__name__
    prefix = c.CLUSTER_KEYED_EVENTS.get(type_)
    cluster = getattr(event, "cluster_id", None)
    if prefix is None or not isinstance(cluster, str):
        return
    expected = f"{prefix}.{cluster}"
    if routing_key == expected:
        return
    if routing_key.startswith(f"{prefix}."):
        raise InvalidRequest(
            f"routing key {routing_key!r} names cluster {routing_key[len(prefix) + 1 :]!r} but the {type_} body "
            f"names cluster {cluster!r}: publish it with routing key {expected!r}",
            location="cluster_id",
        )
    raise InvalidRequest(
        f"routing key {routing_key!r} is not a {type_}'s: its body names cluster {cluster!r}, so its routing key "
        f"is {expected!r}"
    )


def _code(exc: VmschedError) -> str:
    code = getattr(exc, "code", "internal")
    return code if isinstance(code, str) else "internal"


def _describe(exc: BaseException) -> str:
    """'TypeName: text', bounded, for logs and dead-letter reasons; never raises."""
    return f"{type(exc).__name__}: {safe_text(exc, REASON_MAX)}"
