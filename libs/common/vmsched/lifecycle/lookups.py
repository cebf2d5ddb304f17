"""Each request's first question, "was this request id decided before?", asked for many at once.

Every schedule request reads its request id's stored decision on arrival (a replay is answered from
it without waiting for the lock). Under load, requests arrive faster than those reads come back, so
they are coalesced: the ids asked while no read is out go in one read at the loop's next turn;
those asked while one is out wait for it and go together in the next (at most MAX_IDS per read).
One read covers every cluster asked about (DecisionStore.records_by_cluster: a pipeline of one
script per cluster, one round trip). Alone, a request pays what it did (one read, no added wait);
64 at once over 10 clusters pay a few reads between them. A read that fails fails every request
that asked in it; the next asks read again.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from uuid import UUID

from vmsched.store import DecisionStore
from vmsched.store.decisions import StoredDecision

#: The most request ids one read asks for.
MAX_IDS = 256

_Ask = tuple[str, UUID | str, "asyncio.Future[StoredDecision | None]"]


class Lookups:
    """Stored decisions read in coalesced batches (see the module doc)."""

    def __init__(self, decisions: DecisionStore, max_ids: int = MAX_IDS) -> None:
        self._decisions = decisions
        self._max_ids = max_ids
        #: The asks waiting for the next read.
        self._waiting: list[_Ask] = []
        #: The asks of the read that is out.
        self._reading: list[_Ask] = []
        #: The task reading (it reads again while asks keep coming), if any.
        self._reader: asyncio.Task[None] | None = None

    async def record(self, cluster_id: str, request_id: UUID | str) -> StoredDecision | None:
        """The stored record of `request_id` (None if there is none), as DecisionStore.record reads it."""
        found: asyncio.Future[StoredDecision | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((cluster_id, request_id, found))
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name="decision-lookups")
        return await found

    async def _read(self) -> None:
        try:
            # The asks of this loop turn join the first read: yield once before taking them.
            await asyncio.sleep(0)
            while asks := self._take():
                self._reading = asks
                by_cluster: dict[str, list[UUID | str]] = defaultdict(list)
                for cluster, request_id, _ in asks:
                    by_cluster[cluster].append(request_id)
                try:
                    records = await self._decisions.records_by_cluster(by_cluster)
                except Exception as exc:  # Redis away or a bug: each asker hears it
                    for *_, found in asks:
                        if not found.done():
                            found.set_exception(exc)
                    continue
                at = dict.fromkeys(by_cluster, 0)
                for cluster, _, found in asks:
                    record = records[cluster][at[cluster]]
                    at[cluster] += 1
                    if not found.done():
                        found.set_result(record)
        finally:
            self._reader = None
            # Cancelled with asks still waiting or read (the service stopping): they hear it, not hang.
            left, self._waiting, self._reading = [*self._reading, *self._waiting], [], []
            for *_, found in left:
                if not found.done():
                    found.cancel()

    def _take(self) -> list[_Ask]:
        live = [ask for ask in self._waiting if not ask[2].done()]
        taken, self._waiting = live[: self._max_ids], live[self._max_ids :]
        return taken


__all__ = ["MAX_IDS", "Lookups"]
