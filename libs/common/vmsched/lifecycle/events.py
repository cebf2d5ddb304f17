"""Decision events (`decision.<cluster>`) and the stored records they are owed by (see
store/decisions.py for the event rule, lifecycle.replay for who owes what).

* One event per stored decision, published under the cluster's lock by whoever stored it, then
  marked published. Publishing under the lock is what keeps a concurrent duplicate from publishing
  too: it reads the mark only after the storer has released the lock.
* A replay that finds a stored decision not marked published (its selector died in between)
  publishes and marks it; one that finds it marked does not publish again. A crash between
  publishing and marking repeats the event once (events carry the request id).
* Decisions that are not stored (errors, expired requests) are published each time one is made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from uuid import UUID

from vmsched import constants as c
from vmsched.bus import Bus
from vmsched.contracts import ScheduleDecision, ScheduleRequest
from vmsched.lifecycle.replay import Stored, owes_event
from vmsched.lifecycle.timing import Stages, StageTimer, lap_all
from vmsched.logging import get_logger
from vmsched.store import DecisionStore
from vmsched.store.decisions import StoredDecision

# Under the selector's name: the selector is the service whose work these lines report.
log = get_logger("vmsched.selector")


class Events:
    def __init__(self, bus: Bus, decisions: DecisionStore, timer: StageTimer) -> None:
        self.bus = bus
        self.decisions = decisions
        self.timer = timer

    async def publish(self, decision: ScheduleDecision, stages: Stages) -> None:
        """Publish the decision's event (confirmed when this returns)."""
        since = time.perf_counter()
        await self.bus.publish(c.decision_key(decision.cluster_id), decision)
        lap_all(self.timer, [stages], "publish", since)

    async def publish_stored(self, decision: ScheduleDecision, stages: Stages) -> None:
        """Publish a stored decision's event, then mark it published."""
        await self.publish(decision, stages)
        await self.decisions.mark_published(decision.cluster_id, decision.request_id)

    async def publish_unconfirmed(self, cluster_id: str, request_id: UUID, stages: Stages) -> None:
        """Publish the stored decision if it is still not marked published."""
        current = await self.decisions.record(cluster_id, request_id)
        if current is not None and not current.published:
            log.info("publishing a stored decision whose event was not confirmed")
            await self.publish_stored(current.decision, stages)

    async def found(self, found: StoredDecision, fingerprint: str, stages: Stages) -> Stored:
        """A decision stored by another handling, found while holding the cluster's lock: the other
        selector has left the lock, so an event still unconfirmed was never published (it died
        between storing and publishing) and is published now."""
        if owes_event(found, fingerprint):
            await self.publish_stored(found.decision, stages)
        return Stored(found, ours=False)

    async def decided_meanwhile(self, req: ScheduleRequest, fingerprint: str, stages: Stages) -> Stored | None:
        """The decision another handling stored for this request id while this one waited for the
        lock; None if there is none."""
        record = await self.decisions.record(req.cluster_id, req.request_id)
        if record is None:
            return None
        return await self.found(record, fingerprint, stages)

    async def publish_many(
        self, cluster: str, events: Sequence[tuple[ScheduleDecision, Stages] | None]
    ) -> dict[int, BaseException]:
        """Publish the events side by side (their confirms overlap), then mark the confirmed ones
        published in one write. Returns the failure of each position whose event was not confirmed
        (its decision stays unmarked: a replay of the request id publishes it)."""
        since = time.perf_counter()
        sent = await asyncio.gather(
            *(self.bus.publish(c.decision_key(cluster), e[0]) for e in events if e is not None),
            return_exceptions=True,
        )
        outcomes = iter(sent)
        failed: dict[int, BaseException] = {}
        for i, event in enumerate(events):
            if event is None:
                continue
            lap_all(self.timer, [event[1]], "publish", since)
            result = next(outcomes)
            if isinstance(result, BaseException):
                failed[i] = result
        await self.decisions.mark_published_many(
            cluster, [e[0].request_id for i, e in enumerate(events) if e is not None and i not in failed]
        )
        return failed


__all__ = ["Events"]
