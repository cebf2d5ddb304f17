"""The dead-letter queue's operations on both buses: reading dead letters with where they were going,
and sending them there again (`vmsched dead-letters`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from tests.integration.conftest import ON_BOTH_BUSES, Buses
from vmsched import constants as c
from vmsched.bus import Bus, DeadLetter
from vmsched.contracts import PolicyChanged
from vmsched.errors import InvalidRequest
from vmsched.settings import Settings
from vmsched_services.tools.procs import delete_broker_objects

pytestmark = [pytest.mark.integration, ON_BOTH_BUSES]


@pytest.fixture(scope="module")
async def dl_settings(bus_settings: Settings, bus_kind: str) -> AsyncIterator[Settings]:
    """Names of this module's own: `requeue everything` must not touch other tests' dead letters."""
    cfg = bus_settings.model_copy(update={"amqp_prefix": f"{bus_settings.amqp_prefix}dl."})
    yield cfg
    if bus_kind == "amqp":
        await delete_broker_objects(cfg)


@pytest.fixture
async def bus(dl_settings: Settings, buses: Buses) -> AsyncIterator[Bus]:
    async with buses(dl_settings, "dl-test") as b:
        yield b


class Refuser:
    """A subscriber that refuses (dead-letters) every event until told to take them."""

    def __init__(self) -> None:
        self.refuse = True
        self.taken: list[PolicyChanged] = []
        self._arrived = asyncio.Event()

    async def __call__(self, event: PolicyChanged) -> None:
        if self.refuse:
            raise InvalidRequest("refused on purpose", location="policy_id")
        self.taken.append(event)
        self._arrived.set()

    async def wait_taken(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.taken) < count:
                self._arrived.clear()
                await self._arrived.wait()


async def _dead_letter_for(bus: Bus, routing_key: str, count: int = 1) -> list[DeadLetter]:
    async with asyncio.timeout(10):
        while True:
            found = [d for d in await bus.dead_letters(limit=1000) if d.routing_key == routing_key]
            if len(found) >= count:
                return found
            await asyncio.sleep(0.05)


async def test_a_dead_letter_says_why_who_where_and_when(bus: Bus, bus_kind: str) -> None:
    key = f"dl.{uuid.uuid4().hex[:8]}"
    queue = f"dl-q-{uuid.uuid4().hex[:8]}"
    refuser = Refuser()
    await bus.subscribe([key], [PolicyChanged], refuser, queue=queue)
    before = datetime.now(UTC).replace(microsecond=0)
    await bus.publish(key, PolicyChanged(cluster_id="c1"))
    (dl,) = await _dead_letter_for(bus, key)
    assert "refused on purpose" in dl.reason
    assert dl.service == "dl-test"
    assert dl.queue.endswith(queue)
    assert dl.exchange is not None
    assert dl.exchange.endswith(c.EVENTS_EXCHANGE)
    assert dl.type == "PolicyChanged"
    assert dl.dead_lettered_at is not None
    assert before <= dl.dead_lettered_at <= datetime.now(UTC)
    assert PolicyChanged.model_validate_json(dl.body).cluster_id == "c1"
    # Reading leaves it there, under the same id.
    (again,) = await _dead_letter_for(bus, key)
    assert again.id == dl.id


async def test_requeue_sends_the_chosen_ones_back_and_removes_them(bus: Bus) -> None:
    key = f"dl.{uuid.uuid4().hex[:8]}"
    refuser = Refuser()
    await bus.subscribe([key], [PolicyChanged], refuser, queue=f"dl-q-{uuid.uuid4().hex[:8]}")
    await bus.publish(key, PolicyChanged(cluster_id="first"))
    await bus.publish(key, PolicyChanged(cluster_id="second"))
    letters = await _dead_letter_for(bus, key, count=2)
    by_cluster = {PolicyChanged.model_validate_json(d.body).cluster_id: d for d in letters}
    refuser.refuse = False

    result = await bus.requeue_dead_letters([by_cluster["second"].id, "no-such-id"])
    assert result.requeued == [by_cluster["second"].id]
    assert result.skipped == {}
    await refuser.wait_taken(1)
    assert [e.cluster_id for e in refuser.taken] == ["second"]
    left = [d.id for d in await bus.dead_letters(limit=1000) if d.routing_key == key]
    assert left == [by_cluster["first"].id]

    # Everything that can go back goes back; the queue then no longer holds it.
    result = await bus.requeue_dead_letters()
    assert by_cluster["first"].id in result.requeued
    await refuser.wait_taken(2)
    assert [d for d in await bus.dead_letters(limit=1000) if d.routing_key == key] == []


async def test_a_dead_letter_nothing_would_take_stays_with_why(bus: Bus) -> None:
    """Its subscriber's own queue went away with the subscription: requeued, it would be dropped."""
    key = f"dl.{uuid.uuid4().hex[:8]}"
    sub = await bus.subscribe([key], [PolicyChanged], Refuser())
    await bus.publish(key, PolicyChanged(cluster_id="c1"))
    (dl,) = await _dead_letter_for(bus, key)
    await sub.cancel()
    result = await bus.requeue_dead_letters([dl.id])
    assert result.requeued == []
    assert result.skipped == {dl.id: "no queue takes its routing key now"}
    assert [d.id for d in await bus.dead_letters(limit=1000) if d.routing_key == key] == [dl.id]
