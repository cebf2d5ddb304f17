"""What one balancing attempt reads of a cluster (the balancer's ClusterReader): pending first, then the state.

The order is the rule PendingStore.snapshot_with_state states, which the selector and the HA monitor
follow too: the state tracker writes a VM's new state before it clears its pending record, so a
state read after the pending records counts every VM that is not in them. Read the other way round,
a VM whose start or migration completed between the two reads would be in neither: its host would
look emptier than it is, and the VM, no longer in flight, could be picked to move again.

The hosts' table comes from the Runtime's StateCache (the filter-workers' cache): kept between
attempts and cycles, returned as it is while the state version stands still and patched from the
change stream when it moves, instead of being built again from every host's record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from vmsched.contracts import ClusterState, PendingEntry, VmReport
from vmsched.errors import UnknownCluster
from vmsched.logging import get_logger
from vmsched.scheduling.hosts import HostTable
from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.pending import PendingStore
from vmsched.store.state_cache import StateCache
from vmsched.store.state_records import parse_stored

log = get_logger(__name__)

#: Reads of the VMs that may go by while the hosts' table is newer than them (reports keep coming),
#: before the attempt reads hosts and VMs together in one snapshot instead.
MATCH_TRIES = 3


@dataclass(frozen=True)
class ClusterView:
    """A cluster as one attempt sees it: hosts (pending folded in) and VMs at one state version."""

    version: int
    table: HostTable
    vms: list[VmReport]
    pending: list[PendingEntry]

    @property
    def in_flight(self) -> frozenset[str]:
        """VMs with a pending record: a start or migration the state tracker has not seen complete
        (read once per attempt)."""
        return frozenset(e.vm_id for e in self.pending)


class ClusterReader:
    """Reads ClusterViews: the pending records, then the VMs and the cached hosts' table at one version."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, state: StateCache, pending: PendingStore) -> None:
        self._redis = redis
        self._keys = Keys.from_settings(settings)
        self.state = state
        self.pending = pending

    async def read(self, cluster_id: str, now: float | None = None) -> ClusterView:
        now = time.time() if now is None else now
        _, pending, since = await self.pending.snapshot_with_state(cluster_id, now)
        if since is None:
            raise UnknownCluster(f"no state reported for cluster {cluster_id}", location="cluster_id")
        for _ in range(MATCH_TRIES):
            vms_version, vms = await self._vms(cluster_id)
            version, table = await self.state.table(cluster_id, min_version=vms_version)
            if version == vms_version:
                return ClusterView(version, table.with_pending(pending, now=now), vms, pending)
        # The state moves faster than the two reads: both from one snapshot, the table built from it.
        log.debug("hosts and VMs read together: the state kept moving", cluster=cluster_id)
        state = await self.state.snapshot(cluster_id)
        return self._from_snapshot(state, pending, now)

    @staticmethod
    def _from_snapshot(state: ClusterState, pending: list[PendingEntry], now: float) -> ClusterView:
        table = HostTable.from_states(state.hosts, state.settings).with_pending(pending, now=now)
        return ClusterView(state.version, table, state.vms, pending)

    async def _vms(self, cluster_id: str) -> tuple[int, list[VmReport]]:
        """(state version, the cluster's VMs ordered by id), read in one transaction."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._keys.state_version(cluster_id))
            pipe.hgetall(self._keys.state_vms(cluster_id))
            raw_version, raw_vms = await pipe.execute()
        if raw_version is None:
            raise UnknownCluster(f"no state reported for cluster {cluster_id}", location="cluster_id")
        vms = sorted((parse_stored(VmReport, b) for b in raw_vms.values()), key=lambda v: v.vm_id)
        return int(raw_version), vms


__all__ = ["MATCH_TRIES", "ClusterReader", "ClusterView"]
