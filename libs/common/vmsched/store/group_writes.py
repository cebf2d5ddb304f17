"""A group's writes under its cluster's lock, in one round trip: the pending records of every placed
VM and every decision, fenced together.

The same writes as PendingStore.record followed by DecisionStore.put_many with the same token, and
the same records (the scripts share their Lua functions), but one script: both or neither. A newer
lock holder's token refuses the whole commit (FencedOut, nothing written), so a refused commit
never leaves pending records without their decisions, nor decisions whose VMs hold nothing. A
request id that already has a decision keeps it (put_many's rule); where that earlier record is
unreadable (an older schema), put_many replaces it afterwards, in its own round trips, with the
same token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from vmsched.contracts import PendingEntry, ScheduleDecision
from vmsched.settings import Settings
from vmsched.store import decision_scripts as scripts
from vmsched.store.decisions import DecisionStore, StoredDecision, put_args, put_outcomes
from vmsched.store.generations import fenced_out
from vmsched.store.keys import Keys
from vmsched.store.pending import RECORD_PENDING, record_args

# KEYS[1] fence, KEYS[2] pending, KEYS[3] pending-version, KEYS[4] the cluster's decision history,
# KEYS[5..] the decisions; ARGV[1] token, ARGV[2] the pending hash's ttl ms, ARGV[3] how many
# vm_id, json pairs follow from ARGV[4], then the decisions' arguments as put_decisions takes them
# (their token, ttl ms, history cap, six per decision).
# Returns {-1, latest token} when fenced out (nothing written), else {0, pending version,
# put_decisions' reply}.
_COMMIT = (
    scripts.READ_RECORD
    + scripts.REMEMBER
    + scripts.PUT_DECISIONS
    + RECORD_PENDING
    + """
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence ~= tonumber(ARGV[1]) then
  return {-1, fence}
end
local last = 3 + 2 * tonumber(ARGV[3])
local version = record_pending(fence, KEYS[2], KEYS[3], ARGV[2], 4, last)
local d = last + 1
return {0, version, put_decisions(KEYS[4], 5, d + 3, ARGV[d + 1], ARGV[d + 2])}
"""
)


@dataclass(frozen=True)
class Committed:
    #: The cluster's pending version after the write (unchanged when no VM was placed).
    pending_version: int
    #: Per decision, in order: (True, ours) when stored, (False, the record kept) otherwise.
    stored: list[tuple[bool, StoredDecision]]


class GroupWrites:
    """The group commit's one fenced write (see the module doc)."""

    def __init__(
        self, redis: aioredis.Redis, settings: Settings, decisions: DecisionStore, *, keys: Keys | None = None
    ) -> None:
        self._keys = keys or Keys.from_settings(settings)
        self._decisions = decisions
        self._history_max = settings.decision_history_max
        self._commit = redis.register_script(_COMMIT)

    async def commit(
        self,
        cluster_id: str,
        entries: Sequence[PendingEntry],
        items: Sequence[tuple[ScheduleDecision, str]],
        *,
        token: int,
        ttl_s: float,
    ) -> Committed:
        """Record `entries` and store each (decision, fingerprint) of `items`, all of `cluster_id`,
        if `token` is still the cluster's latest fencing token (FencedOut otherwise, nothing
        written)."""
        others = sorted({d.cluster_id for d, _ in items} - {cluster_id})
        if others:
            raise ValueError(f"a group commit writes one cluster's decisions, got {cluster_id} and {', '.join(others)}")
        key_ttl_ms, pairs = record_args(entries, token)
        k = self._keys
        reply = await self._commit(
            keys=[
                k.fence(cluster_id),
                k.pending(cluster_id),
                k.pending_version(cluster_id),
                k.decision_history(cluster_id),
                *(k.decision(cluster_id, d.request_id) for d, _ in items),
            ],
            args=[token, key_ttl_ms, len(entries), *pairs, *put_args(items, token, ttl_s, self._history_max)],
        )
        if int(reply[0]) < 0:
            raise fenced_out("group commit", cluster_id, token, int(reply[1]))
        results: dict[int, tuple[bool, StoredDecision]] = {}
        unreadable = put_outcomes(items, range(len(items)), reply[2], results)
        if unreadable:
            again = [items[i] for i in unreadable]
            stored = await self._decisions.put_many(again, token=token, ttl_s=ttl_s)
            results.update(zip(unreadable, stored, strict=True))
        return Committed(int(reply[1]), [results[i] for i in range(len(items))])


__all__ = ["Committed", "GroupWrites"]
