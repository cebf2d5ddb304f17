"""Decisions by request id: a replayed request gets the same answer; `vmsched explain` reads them.

Each stored decision is a Redis hash under {prefix}:decision:{{cluster}}:{request_id} (under its
cluster's hash tag, as it is written with the cluster's fence and history), kept for a TTL:

- `decision`     the ScheduleDecision JSON;
- `fingerprint`  what the request asked (request_fingerprint), so a request id reused for a
                 different request is refused instead of answered with another request's decision;
- `published`    "0" until its `decision.<cluster>` event is confirmed published, then "1";
- `claimed`      while a replay re-publishes an event not marked published: until when (Redis
                 time, ms) that replay has it (claim_republish), so two never re-publish together;
                 deleted by a claimant whose publish failed (release_claim).

The event rule (the selector follows it): exactly one event per stored decision, published by
whoever stored it, then marked published once confirmed. A replay (a duplicate or
a redelivered request) that finds the decision not marked published re-publishes it and marks it,
but only if it wins the claim on it (claim_republish: one claimant at a time, none once marked):
that recovers a selector that stored the decision and died before publishing. A replay that finds
it marked does not publish again. Redis and RabbitMQ cannot commit together, so a crash between the
broker taking the event and the marking repeats the event once per such crash (so does a selector
frozen past its lock lease between storing and publishing, that resumes after a replay published);
a repeat is the identical event with the same dedup identity (the request id, also the AMQP
message_id), so a subscriber can drop it (docs/guarantees.md).
Decisions that are not stored (errors, expired requests) are published each time they are made.

Writes are fenced like pending resources: `put` stores only if the request id has no decision yet
and `token` is still the cluster's latest fencing token, so a selector that lost the cluster lock
cannot store a decision over (or besides) one its successor made.

Each cluster also has a history, {prefix}:decision-history:{cluster}: a sorted set of the request
ids of its stored decisions by decision time, the newest `settings.decision_history_max` kept, for
`vmsched decisions`. The scripts that store decisions add to it, so it costs no round trip of its
own; `recent` reads the newest in one.

Records written before this layout (a plain ScheduleDecision string) read back with no fingerprint
and as published.

The batched operations (`records`, `put_many`, `mark_published_many`) serve a selector that commits
a group of one cluster's decisions under one lock: one script call, so one round trip, per step
whatever the group's size. `record` and `mark_published` are their one-item case. `put` keeps its
own script because it looks for an existing record before the fence (a stale token still gets the
stored decision back), while `put_many` checks the fence first and writes nothing when fenced out.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.client import Pipeline
from redis.exceptions import NoScriptError

from vmsched.contracts import ScheduleDecision, ScheduleRequest
from vmsched.errors import VmschedError
from vmsched.logging import get_logger
from vmsched.settings import Settings
from vmsched.store import decision_scripts as scripts
from vmsched.store.generations import fenced_out
from vmsched.store.keys import Keys
from vmsched.store.redis import pipelines_scripts, text

log = get_logger(__name__)

#: Request fields left out of the fingerprint: a client resending the same request may set a new
#: deadline (it is about when to give up, not what to place); the request id is the key itself.
FINGERPRINT_EXCLUDES: frozenset[str] = frozenset({"request_id", "deadline"})

#: Attempts of put_many at storing over unreadable records (each replaced only if still the one read).
_PUT_ATTEMPTS = 3


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


def _parse(found: list[Any], request_id: UUID | str) -> StoredDecision | None:
    """The record read() returned; None if there is none (or it cannot be read: an unreadable record
    must not block answering the request again)."""
    if len(found) < 2:
        return None  # absent, or a key of another type
    try:
        decision = ScheduleDecision.model_validate_json(found[1])
    except ValidationError:
        log.warning("unreadable stored decision ignored", request_id=str(request_id))
        return None
    if text(found[0]) == "string":
        return StoredDecision(decision, None, True)
    return StoredDecision(decision, text(found[2]) or None, text(found[3]) == "1")


def _score(decision: ScheduleDecision) -> int:
    """A decision's place in its cluster's history: its decision time in milliseconds."""
    return int(decision.decided_at.timestamp() * 1000)


def _put_args(decision: ScheduleDecision, fingerprint: str, seen: tuple[Any, Any]) -> tuple[Any, ...]:
    """One decision's six arguments of _PUT_MANY."""
    return (decision.model_dump_json(), fingerprint, *seen, str(decision.request_id), _score(decision))


def _ids(request_ids: Sequence[UUID | str]) -> Sequence[UUID | str]:
    # A str is a Sequence[str] too: one request id passed alone would be read as one id per character.
    if isinstance(request_ids, str):
        raise TypeError("request_ids must be a sequence of request ids, not one request id")
    return request_ids


def put_args(
    items: Sequence[tuple[ScheduleDecision, str]], token: int | None, ttl_s: float, history_max: int
) -> list[Any]:
    """PUT_DECISIONS' leading arguments (token, ttl ms, history cap) and six per item, each stored
    only where its request id has no record."""
    head: list[Any] = ["" if token is None else token, max(1, int(ttl_s * 1000)), history_max]
    return [*head, *(a for decision, fp in items for a in _put_args(decision, fp, ("", "")))]


def put_outcomes(
    items: Sequence[tuple[ScheduleDecision, str]],
    indices: Sequence[int],
    reply: Sequence[Any],
    results: dict[int, tuple[bool, StoredDecision]],
) -> dict[int, tuple[Any, Any]]:
    """Read PUT_DECISIONS' reply for items[indices] into `results` (True, ours) or (False, the
    earlier record); returns the items whose earlier record is unreadable, with what it was."""
    unreadable: dict[int, tuple[Any, Any]] = {}
    for i, found in zip(indices, reply, strict=True):
        decision, fingerprint = items[i]
        if not found:
            results[i] = (True, StoredDecision(decision, fingerprint, False))
        elif (existing := _parse(found, decision.request_id)) is not None:
            results[i] = (False, existing)
        else:
            unreadable[i] = (found[0], found[1] if len(found) > 1 else "")
    return unreadable


class DecisionStore:
    """Stored decisions with their request fingerprint and publication mark, kept for a TTL."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self._default_ttl_s = settings.decision_ttl_s
        self._history_max = settings.decision_history_max
        self._get_many = redis.register_script(scripts.GET_MANY)
        self._recent = redis.register_script(scripts.RECENT)
        self._put = redis.register_script(scripts.PUT)
        self._put_many = redis.register_script(scripts.PUT_MANY)
        self._mark_many = redis.register_script(scripts.MARK_MANY)
        self._claim_many = redis.register_script(scripts.CLAIM_MANY)

    async def get(self, cluster_id: str, request_id: UUID | str) -> ScheduleDecision | None:
        record = await self.record(cluster_id, request_id)
        return record.decision if record is not None else None

    async def record(self, cluster_id: str, request_id: UUID | str) -> StoredDecision | None:
        """The stored decision with its fingerprint and publication mark; None if there is none
        (or it cannot be read: an unreadable record must not block answering the request again)."""
        return (await self.records(cluster_id, [request_id]))[0]

    async def records(self, cluster_id: str, request_ids: Sequence[UUID | str]) -> list[StoredDecision | None]:
        """The stored record of each request id, in order, as `record` reads it, in one round trip."""
        if not _ids(request_ids):
            return []
        # One script over every key rather than a pipeline of one read per key: still one round trip,
        # but one command for Redis to run and all the records read at the same instant.
        reply = await self._get_many(keys=[self._keys.decision(cluster_id, r) for r in request_ids])
        return [_parse(found, r) for r, found in zip(request_ids, reply, strict=True)]

    def records_into(self, pipe: Pipeline, cluster_id: str, request_ids: Sequence[UUID | str]) -> str:
        """Queue `records`' read on `pipe` (store.group_reads); returns the script's source (a reply
        of NoScriptError means this server has not loaded it yet)."""
        keys = [self._keys.decision(cluster_id, r) for r in request_ids]
        pipe.evalsha(self._get_many.sha, len(keys), *keys)
        return scripts.GET_MANY

    @staticmethod
    def records_from(request_ids: Sequence[UUID | str], reply: Sequence[Any]) -> list[StoredDecision | None]:
        """`records` from the reply of `records_into`."""
        return [_parse(found, r) for r, found in zip(request_ids, reply, strict=True)]

    async def records_by_cluster(
        self, asks: Mapping[str, Sequence[UUID | str]]
    ) -> dict[str, list[StoredDecision | None]]:
        """`records` of several clusters in one round trip: a pipeline of one read per cluster (each
        over its own cluster's keys, as on Redis Cluster). Raises what a read raised."""
        asks = {cluster: _ids(ids) for cluster, ids in asks.items() if ids}
        if len(asks) <= 1:
            return {cluster: await self.records(cluster, ids) for cluster, ids in asks.items()}
        if not pipelines_scripts(self._redis):
            # Redis Cluster: one read per cluster, side by side (each on its own slot's node).
            found = await asyncio.gather(*(self.records(cluster, ids) for cluster, ids in asks.items()))
            return dict(zip(asks, found, strict=True))
        async with self._redis.pipeline(transaction=False) as pipe:
            for cluster, ids in asks.items():
                keys = [self._keys.decision(cluster, r) for r in ids]
                pipe.evalsha(self._get_many.sha, len(keys), *keys)
            replies = await pipe.execute(raise_on_error=False)
        if any(isinstance(r, NoScriptError) for r in replies):
            # This server has not seen the script yet (new, restarted, failed over): read per cluster,
            # which loads it, and pipeline again next time.
            return {cluster: await self.records(cluster, ids) for cluster, ids in asks.items()}
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return {
            cluster: [_parse(found, r) for r, found in zip(ids, reply, strict=True)]
            for (cluster, ids), reply in zip(asks.items(), replies, strict=True)
        }

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
        key = self._keys.decision(decision.cluster_id, decision.request_id)
        for _ in range(3):
            reply = await self._put(
                keys=[key, self._keys.fence(decision.cluster_id), self._keys.decision_history(decision.cluster_id)],
                args=[
                    decision.model_dump_json(),
                    fingerprint,
                    max(1, int(ttl * 1000)),
                    "" if token is None else token,
                    str(decision.request_id),
                    _score(decision),
                    self._history_max,
                ],
            )
            status = int(reply[0])
            if status == 1:
                return True, StoredDecision(decision, fingerprint, False)
            if status < 0:
                raise fenced_out(
                    f"decision for request {decision.request_id}", decision.cluster_id, token, int(reply[1])
                )
            existing = await self.record(decision.cluster_id, decision.request_id)
            if existing is not None:
                return False, existing
            # Unreadable (an older schema) or expired since: it must not block the request. Stores
            # happen under the cluster's lock, so nobody else is storing this request meanwhile.
            await self._redis.delete(key)
        raise VmschedError(f"decision for request {decision.request_id} could not be stored", location="request_id")

    async def put_many(
        self,
        items: Sequence[tuple[ScheduleDecision, str]],
        *,
        token: int | None = None,
        ttl_s: float | None = None,
    ) -> list[tuple[bool, StoredDecision]]:
        """Store each (decision, fingerprint) as `put` does, in one round trip; all the decisions must
        be of one cluster (ValueError otherwise). Returns, in order, (True, this record) for each
        stored, (False, the earlier record) for each request id that already had one. A request id
        twice in `items` is stored once: its later items get the first one's record.

        With `token`, the whole call is fenced: FencedOut, with nothing written, unless it is the
        cluster's latest fencing token, even where every request id already has a decision.

        An unreadable earlier record (an older schema) is replaced by ours, in one more round trip,
        only if it is still the record that was read.
        """
        if not items:
            return []
        cluster = items[0][0].cluster_id
        others = sorted({d.cluster_id for d, _ in items} - {cluster})
        if others:
            raise ValueError(f"put_many stores the decisions of one cluster, got {cluster} and {', '.join(others)}")
        ttl = self._default_ttl_s if ttl_s is None else ttl_s
        args: list[Any] = ["" if token is None else token, max(1, int(ttl * 1000)), self._history_max]
        results: dict[int, tuple[bool, StoredDecision]] = {}
        # Index in items -> (type, raw json) of the unreadable record it may replace ('' for none).
        todo: dict[int, tuple[Any, Any]] = dict.fromkeys(range(len(items)), ("", ""))
        for _ in range(_PUT_ATTEMPTS):
            reply = await self._put_many(
                keys=[
                    self._keys.fence(cluster),
                    self._keys.decision_history(cluster),
                    *(self._keys.decision(cluster, items[i][0].request_id) for i in todo),
                ],
                args=[*args, *(a for i, seen in todo.items() for a in _put_args(*items[i], seen))],
            )
            if int(reply[0]) < 0:
                ids = [str(d.request_id) for d, _ in items]
                what = f"decisions for requests {', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}"
                raise fenced_out(what, cluster, token, int(reply[1]))
            unreadable = put_outcomes(items, list(todo), reply[1], results)
            if not unreadable:
                return [results[i] for i in range(len(items))]
            todo = unreadable
        left = ", ".join(str(items[i][0].request_id) for i in todo)
        raise VmschedError(f"decisions for requests {left} could not be stored", location="request_id")

    async def recent(self, cluster_id: str, limit: int = 20) -> list[ScheduleDecision]:
        """The cluster's latest stored decisions, newest first, at most `limit` (and at most
        settings.decision_history_max are remembered), in one round trip. Decisions that are not
        stored (errors, expired requests) are not among them; unreadable ones are left out."""
        if limit <= 0:
            return []
        reply = await self._recent(
            keys=[self._keys.decision_history(cluster_id)], args=[limit, self._keys.decision(cluster_id, "")]
        )
        out = []
        for raw_id, found in reply:
            record = _parse(found, text(raw_id))
            if record is not None:
                out.append(record.decision)
        return out

    async def mark_published(self, cluster_id: str, request_id: UUID | str) -> bool:
        """Note that the decision's event was published; True if this call marked it."""
        return (await self.mark_published_many(cluster_id, [request_id]))[0]

    async def mark_published_many(self, cluster_id: str, request_ids: Sequence[UUID | str]) -> list[bool]:
        """`mark_published` of each request id, in order, in one round trip."""
        if not _ids(request_ids):
            return []
        reply = await self._mark_many(keys=[self._keys.decision(cluster_id, r) for r in request_ids])
        return [bool(marked) for marked in reply]

    async def claim_republish(self, cluster_id: str, request_ids: Sequence[UUID | str], lease_s: float) -> list[bool]:
        """Claim the re-publishing of each decision's owed event, in one round trip: True for each
        that this call claimed (not marked published, and no other claim within its `lease_s`), in
        order. Two replays finding the same unmarked decision thus never both publish it; a claimant
        that dies leaves it to the next replay once its lease has passed."""
        if not _ids(request_ids):
            return []
        reply = await self._claim_many(
            keys=[self._keys.decision(cluster_id, r) for r in request_ids], args=[max(1, int(lease_s * 1000))]
        )
        return [bool(claimed) for claimed in reply]

    async def release_claim(self, cluster_id: str, request_id: UUID | str) -> None:
        """Give up this replay's claim (its publish failed): the next replay need not wait for it."""
        await self._redis.hdel(self._keys.decision(cluster_id, request_id), "claimed")

    async def delete(self, cluster_id: str, request_id: UUID | str) -> bool:
        return bool(await self._redis.delete(self._keys.decision(cluster_id, request_id)))


__all__ = ["FINGERPRINT_EXCLUDES", "DecisionStore", "StoredDecision", "request_fingerprint"]
