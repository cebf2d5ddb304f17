"""A group's reads under its cluster's lock, in one round trip: the pending records with their
version and the state version (read together, as PendingStore.snapshot_with_state reads them: a VM
is never counted nowhere), the stored records of the group's request ids (DecisionStore.records),
and, when the selector places the group itself, its state cache's catch-up (StateCache).

One MULTI/EXEC of one cluster's keys (one hash slot, so as on Redis Cluster): what the three reads
side by side would return, for one command to write and one reply to parse instead of three. A
server that has not loaded a script yet (new, restarted, failed over) answers NOSCRIPT for it: the
scripts are loaded and the reads sent once more (then, if still refused, made the usual way). On
Redis Cluster, where redis-py sends no script in a pipeline, the reads go side by side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from vmsched.contracts import PendingEntry
from vmsched.store.decisions import DecisionStore, StoredDecision
from vmsched.store.pending import PendingStore
from vmsched.store.redis import pipelines_scripts
from vmsched.store.state_cache import StateCache
from vmsched.store.state_scripts import CATCH_UP


@dataclass(frozen=True)
class GroupRead:
    """What a group reads before it is placed."""

    pending_version: int
    pending: list[PendingEntry]
    #: None when no state was ever written for the cluster.
    state_version: int | None
    #: The stored record of each request id, in order (None: not decided before).
    records: list[StoredDecision | None]


@dataclass(frozen=True)
class _Sent:
    """One transaction's replies, and what reading them needs."""

    replies: list[Any]
    #: How many replies the pending snapshot took (the first ones).
    taken: int
    #: The version the state cache's catch-up started from (None: none was sent; the last reply).
    caught_from: int | None
    #: The scripts' sources, to load when the server answers NOSCRIPT.
    sources: list[str]

    def unloaded(self) -> bool:
        return any(isinstance(r, NoScriptError) for r in self.replies)


class GroupReads:
    def __init__(
        self, redis: aioredis.Redis, pending: PendingStore, decisions: DecisionStore, state: StateCache | None = None
    ) -> None:
        self._redis = redis
        #: A Redis Cluster client sends no script in a pipeline: the reads go side by side there.
        self._pipelined = pipelines_scripts(redis)
        self._pending = pending
        self._decisions = decisions
        #: The cache caught up in the same round trip (None: the group is placed elsewhere).
        self._state = state

    async def read(self, cluster_id: str, request_ids: Sequence[UUID | str], *, catch_up: bool = True) -> GroupRead:
        """The group's reads (module docstring); the state cache, if any and `catch_up`, moved to the
        version read here when nothing else moved it meanwhile (`StateCache.table` then finds it)."""
        if not self._pipelined:
            return await self._one_by_one(cluster_id, request_ids)
        sent = await self._send(cluster_id, request_ids, catch_up)
        if sent.unloaded():
            # This server has not seen the scripts (new, restarted, failed over): load, then again.
            for source in sent.sources:
                await self._redis.script_load(source)
            sent = await self._send(cluster_id, request_ids, catch_up)
            if sent.unloaded():  # a server flushing its scripts meanwhile: the usual way
                return await self._one_by_one(cluster_id, request_ids)
        replies, taken = sent.replies, sent.taken
        for reply in replies[: taken + (1 if request_ids else 0)]:
            if isinstance(reply, Exception):
                raise reply
        version, pending, state_version = await self._pending.snapshot_from(cluster_id, replies[:taken])
        records = self._decisions.records_from(request_ids, replies[taken]) if request_ids else []
        if sent.caught_from is not None and self._state is not None:
            # A failed catch-up is only a cache left behind: `table` catches up the usual way.
            self._state.catch_up_from(cluster_id, sent.caught_from, replies[-1])
        return GroupRead(version, pending, state_version, records)

    async def _send(self, cluster_id: str, request_ids: Sequence[UUID | str], catch_up: bool) -> _Sent:
        caught_from: int | None = None
        sources: list[str] = []
        async with self._redis.pipeline(transaction=True) as pipe:
            taken = self._pending.snapshot_into(pipe, cluster_id, with_state=True)
            if request_ids:
                sources.append(self._decisions.records_into(pipe, cluster_id, request_ids))
            if self._state is not None and catch_up:
                caught_from = self._state.catch_up_into(pipe, cluster_id)
                if caught_from is not None:
                    sources.append(CATCH_UP)
            replies = await pipe.execute(raise_on_error=False)
        return _Sent(replies, taken, caught_from, sources)

    async def _one_by_one(self, cluster_id: str, request_ids: Sequence[UUID | str]) -> GroupRead:
        (version, pending, state_version), records = await asyncio.gather(
            self._pending.snapshot_with_state(cluster_id), self._decisions.records(cluster_id, request_ids)
        )
        return GroupRead(version, pending, state_version, records)


__all__ = ["GroupRead", "GroupReads"]
