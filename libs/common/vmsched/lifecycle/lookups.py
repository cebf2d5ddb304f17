"""Each request's first question, "was this request id decided before?", asked for many at once.

Every schedule request reads its request id's stored decision on arrival (a replay is answered from
it without waiting for the lock). Under load, requests for one cluster arrive faster than those
reads come back, so they are coalesced: the ids asked while no read of their cluster is out go in
one read at the loop's next turn; those asked while one is out wait for it and go together in the
next (at most MAX_IDS per read). Alone, a request pays what it did (one read, no added wait); 64 at
once pay a few reads between them. A read that fails fails every request that asked in it.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

from vmsched.store import DecisionStore
from vmsched.store.decisions import StoredDecision

#: The most request ids one read asks for (one script over that many keys).
MAX_IDS = 256


class Lookups:
    """Stored decisions read per cluster in coalesced batches (see the module doc)."""

    def __init__(self, decisions: DecisionStore, max_ids: int = MAX_IDS) -> None:
        self._decisions = decisions
        self._max_ids = max_ids
        #: Per cluster, the asks waiting for the next read of it.
        self._waiting: dict[str, list[tuple[UUID | str, asyncio.Future[StoredDecision | None]]]] = {}
        #: Per cluster, the task reading it (it reads again while asks keep coming).
        self._readers: dict[str, asyncio.Task[None]] = {}

    async def record(self, cluster_id: str, request_id: UUID | str) -> StoredDecision | None:
        """The stored record of `request_id` (None if there is none), as DecisionStore.record reads it."""
        found: asyncio.Future[StoredDecision | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(cluster_id, []).append((request_id, found))
        if cluster_id not in self._readers:
            self._readers[cluster_id] = asyncio.create_task(self._read(cluster_id), name=f"lookups-{cluster_id}")
        return await found

    async def _read(self, cluster_id: str) -> None:
        try:
            # The asks of this loop turn join the first read: yield once before taking them.
            await asyncio.sleep(0)
            while asks := self._take(cluster_id):
                try:
                    records = await self._decisions.records(cluster_id, [request_id for request_id, _ in asks])
                except Exception as exc:  # Redis away or a bug: each asker hears it
                    for _, found in asks:
                        if not found.done():
                            found.set_exception(exc)
                    continue
                for (_, found), record in zip(asks, records, strict=True):
                    if not found.done():
                        found.set_result(record)
        finally:
            del self._readers[cluster_id]
            # Cancelled with asks still waiting (the service stopping): they hear it, not hang.
            for _, found in self._waiting.pop(cluster_id, []):
                found.cancel()

    def _take(self, cluster_id: str) -> list[tuple[UUID | str, asyncio.Future[StoredDecision | None]]]:
        waiting = self._waiting.get(cluster_id, [])
        live = [(request_id, found) for request_id, found in waiting if not found.done()]
        taken, rest = live[: self._max_ids], live[self._max_ids :]
        if rest:
            self._waiting[cluster_id] = rest
        else:
            self._waiting.pop(cluster_id, None)
        return taken


__all__ = ["MAX_IDS", "Lookups"]
