"""Decisions by request id: a replayed request gets the same answer; `vmsched explain` reads them.

Each stored decision is a Redis hash under {prefix}:decision:{request_id}, kept for a TTL:

- `decision`     the ScheduleDecision JSON;
- `fingerprint`  what the request asked (request_fingerprint), so a request id reused for a
                 different request is refused instead of answered with another request's decision;
- `published`    "0" until its `decision.<cluster>` event is confirmed published, then "1".

The event rule (the selector follows it): exactly one event per stored decision, published by
whoever stored it, then marked published. A replay (a duplicate or a redelivered request) that
finds the decision not marked published publishes it and marks it: that recovers a selector that
stored the decision and died before publishing. A replay that finds it marked does not publish
again. Redis and RabbitMQ cannot commit together, so a crash between the publish and the marking
repeats the event once (so does a selector frozen past its lock lease between storing and
publishing, that resumes after a replay published); events carry the request id, so a subscriber
can drop the repeat.
Decisions that are not stored (errors, expired requests) are published each time they are made.

Writes are fenced like pending resources: `put` stores only if the request id has no decision yet
and `token` is still the cluster's latest fencing token, so a selector that lost the cluster lock
cannot store a decision over (or besides) one its successor made.

Records written before this layout (a plain ScheduleDecision string) read back with no fingerprint
and as published.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from uuid import UUID

import redis.asyncio as aioredis
from pydantic import ValidationError

from vmsched.contracts import ScheduleDecision, ScheduleRequest
from vmsched.errors import FencedOut, VmschedError
from vmsched.logging import get_logger
from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.redis import text

log = get_logger(__name__)

#: Request fields left out of the fingerprint: a client resending the same request may set a new
#: deadline (it is about when to give up, not what to place); the request id is the key itself.
FINGERPRINT_EXCLUDES: frozenset[str] = frozenset({"request_id", "deadline"})

# KEYS[1] decision. Returns {} if absent, {'string', json} for a record of the older layout, or
# {'hash', json, fingerprint, published}.
_GET = """
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'string' then
  return {'string', redis.call('GET', KEYS[1])}
end
if t == 'hash' then
  local v = redis.call('HMGET', KEYS[1], 'decision', 'fingerprint', 'published')
  return {'hash', v[1] or '', v[2] or '', v[3] or '0'}
end
return {}
"""

# KEYS[1] decision, KEYS[2] the cluster's fence; ARGV[1] json, ARGV[2] fingerprint, ARGV[3] ttl ms,
# ARGV[4] fencing token ('' for none). Returns {1} when stored, {0} when the request id already
# has a decision (kept), {-1, latest token} when fenced out. Running it twice is harmless: the
# second run finds the first one's record.
_PUT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
if ARGV[4] ~= '' then
  local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
  if fence ~= tonumber(ARGV[4]) then
    return {-1, fence}
  end
end
redis.call('HSET', KEYS[1], 'decision', ARGV[1], 'fingerprint', ARGV[2], 'published', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1}
"""

# KEYS[1] decision. Returns 1 if this call marked it, 0 if it was marked already or is gone.
_MARK = """
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return 0
end
if redis.call('HGET', KEYS[1], 'published') == '1' then
  return 0
end
redis.call('HSET', KEYS[1], 'published', '1')
return 1
"""


def request_fingerprint(req: ScheduleRequest) -> str:
    """SHA-256 of the request's canonical JSON, without the fields a resend may change
    (FINGERPRINT_EXCLUDES). Fields at their default are left out too, so a field added later
    with a default does not change the fingerprint of requests that do not use it."""
    body = req.model_dump(mode="json", exclude=set(FINGERPRINT_EXCLUDES), exclude_defaults=True)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class StoredDecision:
    decision: ScheduleDecision
    #: None for a record stored before fingerprints were kept (it matches any request).
    fingerprint: str | None
    #: Its event is confirmed published.
    published: bool

    def matches(self, fingerprint: str) -> bool:
        return self.fingerprint is None or self.fingerprint == fingerprint


class DecisionStore:
    """Stored decisions with their request fingerprint and publication mark, kept for a TTL."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self._default_ttl_s = settings.decision_ttl_s
        self._get = redis.register_script(_GET)
        self._put = redis.register_script(_PUT)
        self._mark = redis.register_script(_MARK)

    async def get(self, request_id: UUID | str) -> ScheduleDecision | None:
        record = await self.record(request_id)
        return record.decision if record is not None else None

    async def record(self, request_id: UUID | str) -> StoredDecision | None:
        """The stored decision with its fingerprint and publication mark; None if there is none
        (or it cannot be read: an unreadable record must not block answering the request again)."""
        reply = await self._get(keys=[self._keys.decision(request_id)])
        if not reply:
            return None
        try:
            decision = ScheduleDecision.model_validate_json(reply[1])
        except ValidationError:
            log.warning("unreadable stored decision ignored", request_id=str(request_id))
            return None
        if text(reply[0]) == "string":
            return StoredDecision(decision, None, True)
        return StoredDecision(decision, text(reply[2]) or None, text(reply[3]) == "1")

    async def put(
        self,
        decision: ScheduleDecision,
        *,
        fingerprint: str,
        token: int | None = None,
        ttl_s: float | None = None,
    ) -> tuple[bool, StoredDecision]:
        """Store the decision, not yet marked published, for `ttl_s` (default:
        settings.decision_ttl_s), unless the request id already has one. Returns (True, this
        record) when stored, (False, the earlier record) when not.

        With `token`, the write is fenced: FencedOut (nothing written) unless it is the cluster's
        latest fencing token.
        """
        ttl = self._default_ttl_s if ttl_s is None else ttl_s
        key = self._keys.decision(decision.request_id)
        for _ in range(3):
            reply = await self._put(
                keys=[key, self._keys.fence(decision.cluster_id)],
                args=[
                    decision.model_dump_json(),
                    fingerprint,
                    max(1, int(ttl * 1000)),
                    "" if token is None else token,
                ],
            )
            status = int(reply[0])
            if status == 1:
                return True, StoredDecision(decision, fingerprint, False)
            if status < 0:
                raise FencedOut(
                    f"decision for request {decision.request_id} refused: token {token} is not the latest "
                    f"of cluster {decision.cluster_id} ({int(reply[1])}); the lock was lost and acquired again",
                    location=f"cluster.{decision.cluster_id}",
                )
            existing = await self.record(decision.request_id)
            if existing is not None:
                return False, existing
            # Unreadable (an older schema) or expired since: it must not block the request. Stores
            # happen under the cluster's lock, so nobody else is storing this request meanwhile.
            await self._redis.delete(key)
        raise VmschedError(f"decision for request {decision.request_id} could not be stored", location="request_id")

    async def mark_published(self, request_id: UUID | str) -> bool:
        """Note that the decision's event was published; True if this call marked it."""
        return bool(await self._mark(keys=[self._keys.decision(request_id)]))

    async def delete(self, request_id: UUID | str) -> bool:
        return bool(await self._redis.delete(self._keys.decision(request_id)))


__all__ = ["FINGERPRINT_EXCLUDES", "DecisionStore", "StoredDecision", "request_fingerprint"]
