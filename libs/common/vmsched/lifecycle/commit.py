"""The one fenced commit of a group's outcomes, placed, unplaceable and waiting alike.

Under the cluster's lock, with its fencing token:

1. the pending records of every placed VM of the group and every decision, placed and unplaceable,
   in one fenced write (store.group_writes): a request id that already has a decision keeps it;
2. their events published side by side (lifecycle.events); an event owed by a decision stored
   before, only if the commit claims it;
3. each request handed its stored decision (a waiting one its pending version: nothing to write);
4. the confirmed events marked published in one write, still under the lock.

A newer lock holder (a token that is no longer the cluster's latest) refuses the commit: FencedOut,
nothing written, and every request of the commit hears it. Pending records and decisions are
written together, so a refused commit never stores a placed decision whose VMs hold nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from vmsched.contracts import ScheduleDecision
from vmsched.lifecycle import decisions as d
from vmsched.lifecycle.events import Events
from vmsched.lifecycle.replay import Stored, event_of
from vmsched.lifecycle.timing import Stages, StageTimer, lap_all
from vmsched.lifecycle.turns import Outcome, Verdict, Wait, fail, settle
from vmsched.logging import get_logger
from vmsched.store.group_writes import GroupWrites

log = get_logger("vmsched.selector")


class Commit:
    def __init__(self, writes: GroupWrites, events: Events, timer: StageTimer, decision_ttl_s: float) -> None:
        self.writes = writes
        self.events = events
        self.timer = timer
        self.decision_ttl_s = decision_ttl_s

    async def __call__(self, cluster: str, token: int, outcomes: Sequence[Outcome]) -> None:
        """Commit the outcomes of one group of `cluster` under the lock acquisition `token` and settle
        each request. Raises what refused or failed a write (FencedOut, a Redis error), after handing
        it to every request still to be stored."""
        verdicts: list[Verdict] = []
        for outcome in outcomes:
            if isinstance(outcome, Wait):
                settle(outcome.turn, outcome.pending_version)
            else:
                verdicts.append(outcome)
        if not verdicts:
            return
        try:
            await self._store(cluster, token, verdicts)
        except Exception as exc:
            for verdict in verdicts:
                fail(verdict.turn, exc)
            raise

    async def _store(self, cluster: str, token: int, verdicts: list[Verdict]) -> None:
        entries = [e for v in verdicts for e in v.pending]
        decisions = [_decision(v, token) for v in verdicts]
        since = time.perf_counter()
        stored = (
            await self.writes.commit(
                cluster,
                entries,
                [(decision, v.turn.fingerprint) for decision, v in zip(decisions, verdicts, strict=True)],
                token=token,
                ttl_s=self.decision_ttl_s,
            )
        ).stored
        # The pending records' share of the handling (decisions go with them in the same write).
        lap_all(self.timer, [v.turn.stages for v in verdicts if v.placed], "record_pending", since)
        # One event per stored decision: ours, or one stored before for the same request whose
        # event was never confirmed, if this commit wins the claim on re-publishing it.
        due = [
            event_of(created, record, v.turn.fingerprint) for v, (created, record) in zip(verdicts, stored, strict=True)
        ]
        claimed = await self.events.claimed(
            cluster,
            [e.request_id for e, (created, _) in zip(due, stored, strict=True) if e is not None and not created],
        )
        events: list[tuple[ScheduleDecision, Stages] | None] = [
            (e, v.turn.stages) if e is not None and (created or e.request_id in claimed) else None
            for e, v, (created, _) in zip(due, verdicts, stored, strict=True)
        ]
        failed = await self.events.publish_many(cluster, events)
        for i, (v, (created, record)) in enumerate(zip(verdicts, stored, strict=True)):
            if i in failed:
                # Stored but its event not confirmed: a replay of the request id publishes it.
                fail(v.turn, failed[i])
            else:
                settle(v.turn, Stored(record, ours=created))
        # Answered first, marked after: the replies leave one round trip sooner. The mark is still
        # written under the lock, and a replay reads it only under the lock, so none publishes again.
        confirmed = [e[0].request_id for i, e in enumerate(events) if e is not None and i not in failed]
        try:
            await self.events.mark_published(cluster, confirmed)
        except Exception as exc:  # the decisions are stored and their events out: only the mark is lost
            log.warning(
                "decision events published but not marked: a replay of these request ids publishes again",
                cluster=cluster,
                request_ids=[str(r) for r in confirmed],
                error=repr(exc),
            )


def _decision(verdict: Verdict, token: int) -> ScheduleDecision:
    turn = verdict.turn
    if verdict.placed:
        return d.placed(
            turn.req,
            turn.started,
            verdict.placements,
            verdict.explanation,
            policy=turn.policy,
            version=verdict.version,
            token=token,
            retried=turn.retried,
        )
    return d.unplaceable(
        turn.req,
        turn.started,
        verdict.explanation,
        policy=turn.policy,
        version=verdict.version,
        retried=turn.retried,
    )


__all__ = ["Commit"]
