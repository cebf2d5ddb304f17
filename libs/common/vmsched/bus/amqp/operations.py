"""What operators ask of the broker: queue depths, and the dead-letter queue read and sent again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Sequence
from datetime import UTC, datetime

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, DeliveryMode

from vmsched import constants as c
from vmsched.bus.amqp.connection import BROKER_ERRORS, BrokerLink
from vmsched.bus.base import DeadLetter, RequeueResult
from vmsched.bus.codec import CONTENT_TYPE


async def queue_depths(link: BrokerLink, queues: Sequence[str]) -> dict[str, int | None]:
    """Passive declares on a plain aiormq channel: one refused for a missing queue closes it
    (NOT_FOUND), and a plain channel is simply replaced, where a robust one would be restored."""
    await link.ready(link.settings.rpc_timeout_s)
    out: dict[str, int | None] = {}
    try:
        async with asyncio.timeout(link.settings.rpc_timeout_s):
            amqp = link.plain_connection()
            ch = await amqp.channel()
            try:
                for queue in queues:
                    try:
                        declared = await ch.queue_declare(link.name(queue), passive=True)
                    except aiormq.exceptions.ChannelNotFoundEntity:
                        out[queue] = None
                        ch = await amqp.channel()
                        continue
                    out[queue] = int(declared.message_count or 0) if declared is not None else None
            finally:
                with contextlib.suppress(Exception):
                    await ch.close()
    except (*BROKER_ERRORS, TimeoutError) as exc:
        raise link.unavailable(exc) from None
    return out


async def dead_letters(link: BrokerLink, limit: int = 100) -> list[DeadLetter]:
    out: list[DeadLetter] = []
    try:
        if link.declares:
            await link.declare_dead_letter_queue()  # same arguments, and the same tolerance of an older queue
        async with link.connection.channel(publisher_confirms=False) as ch:
            q = await ch.declare_queue(link.name(c.DEAD_LETTER_QUEUE), passive=True)
            taken: list[AbstractIncomingMessage] = []
            for _ in range(max(limit, 0)):
                msg = await q.get(fail=False, no_ack=False)
                if msg is None:
                    break
                taken.append(msg)
                out.append(_dead_letter(msg))
            # Unacked messages go back for the next reader: to the head of a classic queue in their
            # order, to the tail of a quorum queue.
            for msg in taken:
                await msg.nack(requeue=True)
    except aiormq.exceptions.ChannelAccessRefused as exc:
        raise link.refused(exc, "reading the dead letters") from None
    except BROKER_ERRORS as exc:
        raise link.unavailable(exc) from None
    # Oldest first by when they were dead-lettered, not by where the queue holds them now: a quorum
    # queue's order turns with every read, and the numbers `vmsched dead-letters` gives must not.
    oldest = datetime.min.replace(tzinfo=UTC)
    return sorted(out, key=lambda d: (d.dead_lettered_at or oldest, d.id))


async def requeue_dead_letters(link: BrokerLink, ids: Collection[str] | None = None) -> RequeueResult:
    wanted = None if ids is None else set(ids)
    result = RequeueResult()
    exchanges = {*(link.name(x) for x in c.RPC_EXCHANGES), link.name(c.EVENTS_EXCHANGE), ""}
    try:
        if link.declares:
            await link.declare_dead_letter_queue()
        async with link.connection.channel(publisher_confirms=True) as ch:
            q = await ch.declare_queue(link.name(c.DEAD_LETTER_QUEUE), passive=True)
            # Only what is there now: a requeued message refused again comes back at the tail.
            present = q.declaration_result.message_count or 0
            held: list[AbstractIncomingMessage] = []
            for _ in range(present):
                msg = await q.get(fail=False, no_ack=False)
                if msg is None:
                    break
                dl = _dead_letter(msg)
                if wanted is not None and dl.id not in wanted:
                    held.append(msg)
                    continue
                why = dl.unrequeueable(exchanges) or await _send_again(ch, dl)
                if why is None:
                    await msg.ack()
                    result.requeued.append(dl.id)
                else:
                    result.skipped[dl.id] = why
                    held.append(msg)
            for msg in held:
                await msg.nack(requeue=True)
    except aiormq.exceptions.ChannelAccessRefused as exc:
        raise link.refused(exc, "reading the dead letters") from None
    except BROKER_ERRORS as exc:
        raise link.unavailable(exc) from None
    return result


async def _send_again(ch: AbstractChannel, dl: DeadLetter) -> str | None:
    """Publish a dead letter where it was first published (confirmed), naming no sender: whoever
    requeues it does not vouch for whoever sent it first, so a removal or an administration request
    requeued is refused again, not laundered. Why not, if it was returned."""
    exchange = ch.default_exchange if not dl.exchange else await ch.get_exchange(dl.exchange, ensure=False)
    returned = await exchange.publish(
        aio_pika.Message(
            dl.body,
            headers=dl.requeue_headers(),
            content_type=CONTENT_TYPE,
            type=dl.type,
            delivery_mode=DeliveryMode.PERSISTENT,
        ),
        routing_key=dl.routing_key,
        mandatory=True,
    )
    if isinstance(returned, aiormq.abc.DeliveredMessage):
        return "no queue takes its routing key now"
    return None


def _dead_letter(msg: AbstractIncomingMessage) -> DeadLetter:
    return DeadLetter.parse(msg.routing_key or "", msg.body, dict(msg.headers or {}), msg.type)


__all__ = ["dead_letters", "queue_depths", "requeue_dead_letters"]
