"""Pending resources (oVirt's scheduler design): what placed VMs use on their hosts until the engine confirms them.

Per cluster, one Redis hash vm_id -> PendingEntry JSON. One record per VM, so a VM's resources are
counted once however often it is placed, and cleared exactly once (the RUNNING report on its host,
a FAILED/DOWN report, or expiry). Every change INCRs the cluster's pending-version key, which a
request that found no host waits on before its one retry.

Writes are fenced: `record` is refused (FencedOut, nothing written) unless its token is the
cluster's latest fencing token, so a scheduler that stalled past its lock's hold time and lost the
lock to another cannot add pending resources computed from stale state.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.client import Pipeline

from vmsched.contracts import PendingEntry
from vmsched.logging import get_logger
from vmsched.settings import Settings
from vmsched.store._aio import cancel_requests, raise_if_cancelled
from vmsched.store.generations import STAMP_SPAN, fenced_out
from vmsched.store.keys import Keys

log = get_logger(__name__)

#: Added to the latest entry's expiry for the hash's own TTL: the key-level expiry is only a
#: safety net for a cluster nobody reads any more; entries expire individually (lazily, on read).
KEY_TTL_MARGIN_S = 60.0

# Defines record_pending(fence, pending, version, ttl ms, first, last): the vm_id, json pairs of
# ARGV[first..last] into the cluster's pending hash (kept at least `ttl`), under the fencing token
# `fence` the caller has checked. Returns the new pending version (the current one when there is
# no pair). The token is a stamp of the cluster's generation (store.generations), and so is the
# pending version it leaves: a pending view cached before Redis forgot is older than any written
# after. Also the group commit's (store.group_writes).
RECORD_PENDING = f"""
local function record_pending(fence, pending, version, ttl, first, last)
  local base = fence - fence % {STAMP_SPAN}
  if tonumber(redis.call('GET', version) or '0') < base then
    redis.call('SET', version, string.format('%d', base))
  end"""
RECORD_PENDING += """
  if last < first then
    return tonumber(redis.call('GET', version) or '0')
  end
  for i = first, last, 2 do
    redis.call('HSET', pending, ARGV[i], ARGV[i + 1])
  end
  if redis.call('PTTL', pending) < tonumber(ttl) then
    redis.call('PEXPIRE', pending, ttl)
  end
  return redis.call('INCR', version)
end
"""

# KEYS[1] fence, KEYS[2] pending, KEYS[3] pending-version
# ARGV[1] token, ARGV[2] key ttl ms, ARGV[3..] vm_id, json pairs
# Returns {1, new pending version} or {0, latest fencing token}.
_RECORD = (
    RECORD_PENDING
    + """
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if fence ~= tonumber(ARGV[1]) then
  return {0, fence}
end
return {1, record_pending(fence, KEYS[2], KEYS[3], ARGV[2], 3, #ARGV)}
"""
)

# KEYS[1] pending, KEYS[2] pending-version; ARGV[1] vm_id, ARGV[2] host_id or ''.
# Returns 1 if this call removed the record, else 0.
_CLEAR = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
  return 0
end
if ARGV[2] ~= '' then
  local ok, e = pcall(cjson.decode, v)
  if not ok or type(e) ~= 'table' or e['host_id'] ~= ARGV[2] then
    return 0
  end
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('INCR', KEYS[2])
return 1
"""

# KEYS[1] pending, KEYS[2] pending-version; ARGV vm ids.
# Removes each VM's record; returns the records, in ARGV's order (false: the VM had none). The
# version moves once however many went: a waiter needs a change, not a count of them.
_TAKE = """
local out, n = {}, 0
for i = 1, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v then
    redis.call('HDEL', KEYS[1], ARGV[i])
    n = n + 1
    out[i] = v
  else
    out[i] = false
  end
end
if n > 0 then
  redis.call('INCR', KEYS[2])
end
return out
"""

# KEYS[1] pending, KEYS[2] pending-version; ARGV vm_id, exact json pairs.
# Deletes a record only if it is still the exact one seen expired (a VM placed again since keeps
# its new record). Returns {removed, pending version after}.
_DROP = """
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    n = n + 1
  end
end
if n > 0 then
  return {n, redis.call('INCR', KEYS[2])}
end
return {0, tonumber(redis.call('GET', KEYS[2]) or '0')}
"""

#: Clusters per pipeline when counting records: bounds one round trip's reply.
COUNT_BATCH = 500


def _expires_at(blob: bytes) -> float:
    """A record's expiry; minus infinity for one that cannot be read (it counts as expired)."""
    try:
        return PendingEntry.model_validate_json(blob).expires_at
    except ValidationError:
        return -math.inf


def record_args(entries: Sequence[PendingEntry], token: int) -> tuple[int, list[str]]:
    """RECORD_PENDING's arguments for `entries`: the hash's time-to-live (ms) and the vm_id, json
    pairs. Each entry must carry `token` (ValueError otherwise), so a record says which lock
    acquisition wrote it."""
    for e in entries:
        if e.fencing_token != token:
            raise ValueError(f"pending entry of vm {e.vm_id} carries token {e.fencing_token}, written with {token}")
    now = time.time()
    latest = max((e.expires_at for e in entries), default=now)
    pairs: list[str] = []
    for e in entries:
        pairs += [e.vm_id, e.model_dump_json()]
    return max(1000, math.ceil((latest - now + KEY_TTL_MARGIN_S) * 1000)), pairs


class PendingStore:
    """Pending-resource records per cluster, fenced by the cluster lock's token."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self._record = redis.register_script(_RECORD)
        self._clear = redis.register_script(_CLEAR)
        self._drop = redis.register_script(_DROP)
        self._take = redis.register_script(_TAKE)

    async def record(self, cluster_id: str, entries: Sequence[PendingEntry], token: int) -> int:
        """Add (or replace) the VMs' records atomically, if `token` is still the cluster's latest
        fencing token; returns the new pending version. Raises FencedOut (nothing written) if
        any newer lock acquisition happened.

        Each entry must carry the same token (`fencing_token`), so a record says which
        acquisition wrote it.
        """
        key_ttl_ms, pairs = record_args(entries, token)
        args: list[str | int] = [token, key_ttl_ms, *pairs]
        ok, value = await self._record(
            keys=[
                self._keys.fence(cluster_id),
                self._keys.pending(cluster_id),
                self._keys.pending_version(cluster_id),
            ],
            args=args,
        )
        if not ok:
            raise fenced_out("pending write", cluster_id, token, int(value))
        return int(value)

    async def read(self, cluster_id: str, now: float | None = None) -> list[PendingEntry]:
        """The cluster's records that have not expired at `now` (unix seconds; default: the
        current time), ordered by vm id. Expired and unreadable records are removed from Redis."""
        _, entries = await self.snapshot(cluster_id, now)
        return entries

    async def snapshot(self, cluster_id: str, now: float | None = None) -> tuple[int, list[PendingEntry]]:
        """(pending version, live records), read together: waiting for a change since this
        version cannot miss a change these records do not already reflect."""
        version, entries, _ = await self._snapshot(cluster_id, now, with_state=False)
        return version, entries

    async def snapshot_with_state(
        self, cluster_id: str, now: float | None = None
    ) -> tuple[int, list[PendingEntry], int | None]:
        """(pending version, live records, the cluster's state version or None if no state was
        ever written), read in one transaction. The state tracker writes a VM's new state before it
        clears its pending record, so state at this version or later counts every VM that is not
        in these records: none is counted nowhere."""
        return await self._snapshot(cluster_id, now, with_state=True)

    async def _snapshot(
        self, cluster_id: str, now: float | None, *, with_state: bool
    ) -> tuple[int, list[PendingEntry], int | None]:
        async with self._redis.pipeline(transaction=True) as pipe:
            self.snapshot_into(pipe, cluster_id, with_state=with_state)
            replies = await pipe.execute()
        return await self.snapshot_from(cluster_id, replies, now)

    def snapshot_into(self, pipe: Pipeline, cluster_id: str, *, with_state: bool = True) -> int:
        """Queue the snapshot's reads on a transaction `pipe` (store.group_reads); returns how many
        replies they take, for `snapshot_from`."""
        pipe.get(self._keys.pending_version(cluster_id))
        pipe.hgetall(self._keys.pending(cluster_id))
        if with_state:
            pipe.get(self._keys.state_version(cluster_id))
        return 3 if with_state else 2

    async def snapshot_from(
        self, cluster_id: str, replies: Sequence[Any], now: float | None = None
    ) -> tuple[int, list[PendingEntry], int | None]:
        """The snapshot from the replies of `snapshot_into` (dropping expired and unreadable
        records from Redis: one more round trip only when there are any)."""
        now = time.time() if now is None else now
        raw_version, raw, *rest = replies
        state_version = int(rest[0]) if rest and rest[0] is not None else None
        version = int(raw_version) if raw_version is not None else 0
        live: list[PendingEntry] = []
        dead: list[bytes] = []
        for vm_id, blob in raw.items():
            try:
                entry = PendingEntry.model_validate_json(blob)
            except ValidationError:
                log.warning("unreadable pending record dropped", cluster=cluster_id, vm=vm_id.decode())
                dead += [vm_id, blob]
                continue
            if entry.expires_at <= now:
                dead += [vm_id, blob]
            else:
                live.append(entry)
        if dead:
            _removed, after = await self._drop(
                keys=[self._keys.pending(cluster_id), self._keys.pending_version(cluster_id)], args=dead
            )
            # Adopt the version after our own deletions only if nothing else changed in between;
            # otherwise keep the older one, so a waiter sees that other change at once.
            if int(after) == version + 1:
                version = int(after)
        live.sort(key=lambda e: e.vm_id)
        return version, live, state_version

    async def clear(self, cluster_id: str, vm_id: str, host_id: str | None = None) -> bool:
        """Remove the VM's record (only if it is on `host_id`, when given). True for the one
        call that removed it; False if there was none (already cleared, expired, other host)."""
        removed = await self._clear(
            keys=[self._keys.pending(cluster_id), self._keys.pending_version(cluster_id)],
            args=[vm_id, host_id or ""],
        )
        return bool(removed)

    async def forget(self, cluster_id: str) -> int:
        """Drop every record of the cluster (it was removed); returns how many there were. The
        pending version still moves on, so a request waiting for a change wakes up."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hlen(self._keys.pending(cluster_id))
            pipe.delete(self._keys.pending(cluster_id))
            pipe.incr(self._keys.pending_version(cluster_id))
            count, _, _ = await pipe.execute()
        return int(count)

    async def get(self, cluster_id: str, vm_id: str) -> PendingEntry | None:
        """The VM's record, if any (expired or not: the caller decides)."""
        raw = await self._redis.hget(self._keys.pending(cluster_id), vm_id)
        if raw is None:
            return None
        try:
            return PendingEntry.model_validate_json(raw)
        except ValidationError:
            return None

    async def take(self, cluster_id: str, vm_ids: Sequence[str]) -> dict[str, PendingEntry | None]:
        """Remove the records of these VMs, in one round trip; returns, for each VM that had one,
        what `get` would have read just before (None for a record that cannot be read: removed
        all the same, as `clear` removes it). VMs without a record are not in the result."""
        wanted = list(dict.fromkeys(vm_ids))
        if not wanted:
            return {}
        raw = await self._take(
            keys=[self._keys.pending(cluster_id), self._keys.pending_version(cluster_id)], args=wanted
        )
        taken: dict[str, PendingEntry | None] = {}
        for vm_id, blob in zip(wanted, raw, strict=True):
            if blob is None:
                continue
            try:
                taken[vm_id] = PendingEntry.model_validate_json(blob)
            except ValidationError:
                taken[vm_id] = None
        return taken

    async def counts(self, cluster_ids: Sequence[str], now: float | None = None) -> dict[str, int]:
        """How many unexpired records each cluster holds (for the pending gauge). Read only: expired
        and unreadable records are not counted, but left for the next snapshot to remove."""
        now = time.time() if now is None else now
        out: dict[str, int] = {}
        for start in range(0, len(cluster_ids), COUNT_BATCH):
            batch = cluster_ids[start : start + COUNT_BATCH]
            async with self._redis.pipeline(transaction=False) as pipe:
                for cid in batch:
                    pipe.hvals(self._keys.pending(cid))
                replies = await pipe.execute()
            for cid, blobs in zip(batch, replies, strict=True):
                out[cid] = sum(1 for blob in blobs if _expires_at(blob) > now)
        return out

    async def version(self, cluster_id: str) -> int:
        """Changes whenever the cluster's records change (0 before the first change)."""
        raw = await self._redis.get(self._keys.pending_version(cluster_id))
        return int(raw) if raw is not None else 0

    async def wait_for_change(self, cluster_id: str, since_version: int, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the pending version to differ from `since_version`.

        Compared with !=, not >: should the version key ever be lost and restart, a waiter
        still wakes instead of sleeping out its timeout. Polls (every 5 ms rising to 50 ms):
        waits are short and rare (only a request that found no host waits).
        """
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        cancels = cancel_requests()
        while True:
            changed = await self.version(cluster_id) != since_version
            raise_if_cancelled(cancels)
            if changed:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)


__all__ = ["KEY_TTL_MARGIN_S", "PendingStore"]
