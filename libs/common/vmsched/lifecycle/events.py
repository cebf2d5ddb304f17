"""Decision events (`decision.<cluster>`) and the stored records they are owed by (see
store/decisions.py for the event rule, lifecycle.replay for who owes what).

* One event per stored decision, published under the cluster's lock by whoever stored it, and
  marked published once confirmed (a group's events in one write). Publishing under the lock is
  what keeps a concurrent duplicate from publishing too: it reads the mark only after the storer
  has released the lock.
* A replay that finds a stored decision not marked published (its selector died in between)
  re-publishes and marks it if it wins the claim on it (DecisionStore.claim_republish), so two
  replays (with or without the lock) never both re-publish; one that finds it marked does not
  publish again. A crash between the broker taking the event and its marking repeats it once.
* The event of a stored decision carries its dedup identity: the AMQP message_id is the request
  id, and a repeat is the identical event (same request id, decided_at, fencing token).
* Decisions that are not stored (errors, expired requests) are published each time one is made,
  each with a message_id of its own (one the client library makes up): each is an event of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
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

#: How often a replay looks again at an event another replay has claimed.
_CLAIM_POLL_S = 0.05

# Under the selector's name: the selector is the service whose work these lines report.
log = get_logger("vmsched.selector")


class Events:
    def __init__(self, bus: Bus, decisions: DecisionStore, timer: StageTimer, claim_s: float) -> None:
        self.bus = bus
        self.decisions = decisions
        self.timer = timer
        #: How long a replay's claim on re-publishing an event lasts: longer than a publish and its
        #: marking take (a slower claimant may be overtaken: one more repeat), short enough that a
        #: replay finding the claim of a dead one waits little.
        self.claim_s = claim_s

    async def publish(self, decision: ScheduleDecision, stages: Stages) -> None:
        """Publish the event of a decision that is not stored (confirmed when this returns)."""
        since = time.perf_counter()
        await self.bus.publish(c.decision_key(decision.cluster_id), decision)
        lap_all(self.timer, [stages], "publish", since)

    async def republish(self, decision: ScheduleDecision, stages: Stages) -> None:
        """Publish a stored decision's owed event, if this replay wins the claim on it, then mark it
        published."""
        if not await self.claimed(decision.cluster_id, [decision.request_id]):
            return
        log.info("publishing a stored decision whose event was not confirmed", request_id=str(decision.request_id))
        since = time.perf_counter()
        try:
            await self.bus.publish(c.decision_key(decision.cluster_id), decision, message_id=dedup_id(decision))
        except BaseException:
            with contextlib.suppress(Exception):
                await self.decisions.release_claim(
                    decision.cluster_id, decision.request_id
                )  # the next replay need not wait
            raise
        lap_all(self.timer, [stages], "publish", since)
        await self.decisions.mark_published(decision.cluster_id, decision.request_id)

    async def claimed(self, cluster_id: str, request_ids: Sequence[UUID]) -> set[UUID]:
        """The request ids whose owed events this replay claimed (no round trip for none). One
        claimed by another replay is waited for (at most twice the claim's lease): it ends marked
        published (nothing to do), or its claimant died or failed and it is claimed here; this is
        what keeps a dead claimant from leaving the event unpublished."""
        won: set[UUID] = set()
        left = list(request_ids)
        end = time.monotonic() + 2 * self.claim_s
        while left:
            got = await self.decisions.claim_republish(cluster_id, left, self.claim_s)
            won.update(r for r, ok in zip(left, got, strict=True) if ok)
            left = [r for r, ok in zip(left, got, strict=True) if not ok]
            if left:
                records = await self.decisions.records(cluster_id, left)
                left = [r for r, rec in zip(left, records, strict=True) if rec is not None and not rec.published]
            if left and time.monotonic() > end:
                log.warning(
                    "stored decisions' events still claimed by another replay", request_ids=[str(r) for r in left]
                )
                break
            if left:
                await asyncio.sleep(_CLAIM_POLL_S)
        return won

    async def publish_unconfirmed(self, cluster_id: str, request_id: UUID, stages: Stages) -> None:
        """Publish the stored decision if it is still not marked published."""
        current = await self.decisions.record(cluster_id, request_id)
        if current is not None and not current.published:
            await self.republish(current.decision, stages)

    async def found(self, found: StoredDecision, fingerprint: str, stages: Stages) -> Stored:
        """A decision stored by another handling, found while holding the cluster's lock: the other
        selector has left the lock, so an event still unconfirmed was never published (it died
        between storing and publishing) and is published now."""
        if owes_event(found, fingerprint):
            await self.republish(found.decision, stages)
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
        """Publish the stored decisions' events side by side (their confirms overlap). Returns the
        failure of each position whose event was not confirmed (its decision stays unmarked: a
        replay of the request id publishes it). The confirmed ones are marked published by
        `mark_published`, still under the lock: one write for the group whatever its size (marking
        wave by wave as confirms arrive was measured to repeat no fewer events under selector_kill,
        for more round trips)."""
        since = time.perf_counter()
        sent = await asyncio.gather(
            *(
                self.bus.publish(c.decision_key(cluster), e[0], message_id=dedup_id(e[0]))
                for e in events
                if e is not None
            ),
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
        return failed

    async def mark_published(self, cluster: str, request_ids: Sequence[UUID]) -> None:
        """Mark confirmed events published (one write; none for none). Called under the cluster's
        lock, so a replay, which looks at the mark under the lock, sees it."""
        if request_ids:
            await self.decisions.mark_published_many(cluster, list(request_ids))


def dedup_id(decision: ScheduleDecision) -> str:
    """The dedup identity of a stored decision's event (its AMQP message_id): the request id, of
    which there is one stored decision (docs/guarantees.md, "Decision events")."""
    return str(decision.request_id)


__all__ = ["Events", "dedup_id"]
