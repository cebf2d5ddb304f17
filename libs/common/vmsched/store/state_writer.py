"""The cluster state's single writer: StateWriter, which applies engine reports (the state tracker only).

One state-tracker process writes at a time: the trackers take turns on one durable queue (a
single active consumer, constants.SINGLE_ACTIVE_QUEUES), so reports are applied in order. The
writer keeps the cluster in memory and derives host aggregates from it; it loads from Redis at
start (so state survives a tracker restart). As a guard, not as a way to run writers side by side
(a standby taking over finds Redis ahead of what it loaded), each write names the version it was
computed from and is refused if Redis has moved on; the writer then reloads the cluster and applies
the report once more (reports are absolute states, so applying one again is harmless). The layout
it writes is described in vmsched.store.state_scripts.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from pydantic import ValidationError

from vmsched.constants import STATE_CHANGES_MAXLEN
from vmsched.contracts import ClusterReport, ClusterState, HostReport, HostState, HostStatus, VmReport, VmStatus
from vmsched.errors import GenerationLost, StateConflict
from vmsched.logging import get_logger
from vmsched.scheduling.host_aggregates import aggregate_host, counts_on_host
from vmsched.settings import Settings
from vmsched.store.generations import GENERATION_LOST, Recover, counter_of, stamp
from vmsched.store.keys import Keys
from vmsched.store.redis import text as _text
from vmsched.store.state_batch import StateWrite, merge
from vmsched.store.state_records import parse_stored
from vmsched.store.state_scripts import APPLY, REMOVE_CLUSTER

log = get_logger(__name__)

#: CPU load reports kept per host: enough for CpuOverCommitDurationMinutes at a report every
#: few seconds; the CPUOverloaded filter needs the run of reports over its threshold.
CPU_SAMPLES_KEPT = 120


@dataclass
class _Cluster:
    """One cluster as the writer holds it: reports as received, VMs indexed by host."""

    cluster_id: str
    version: int = 0
    settings: ClusterReport | None = None
    hosts: dict[str, HostReport] = field(default_factory=dict)
    vms: dict[str, VmReport] = field(default_factory=dict)
    by_host: dict[str, set[str]] = field(default_factory=dict)
    #: Per host: recent (unix time, CPU %) reports, oldest first, at most CPU_SAMPLES_KEPT.
    cpu_samples: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: Per host: failed VM starts since the last successful one.
    build_failures: dict[str, int] = field(default_factory=dict)
    #: Hosts by status, kept with `hosts` (put_host) so the hosts gauge costs nothing per report.
    statuses: Counter[HostStatus] = field(default_factory=Counter)

    def put_host(self, report: HostReport) -> None:
        old = self.hosts.get(report.host_id)
        if old is not None:
            self.statuses[old.status] -= 1
        self.hosts[report.host_id] = report
        self.statuses[report.status] += 1

    def put_vm(self, vm: VmReport) -> None:
        self.drop_vm(vm.vm_id)
        assert vm.host_id is not None
        self.vms[vm.vm_id] = vm
        self.by_host.setdefault(vm.host_id, set()).add(vm.vm_id)

    def drop_vm(self, vm_id: str) -> VmReport | None:
        old = self.vms.pop(vm_id, None)
        if old is not None and old.host_id is not None:
            on_host = self.by_host.get(old.host_id)
            if on_host is not None:
                on_host.discard(vm_id)
                if not on_host:
                    del self.by_host[old.host_id]
        return old

    def drop_host(self, host_id: str) -> list[str]:
        """Forget a host and the VMs counted on it; returns those VMs' ids."""
        self.statuses[self.hosts.pop(host_id).status] -= 1
        self.cpu_samples.pop(host_id, None)
        self.build_failures.pop(host_id, None)
        vm_ids = sorted(self.by_host.pop(host_id, ()))
        for vm_id in vm_ids:
            self.vms.pop(vm_id, None)
        return vm_ids

    def host_state(self, host_id: str) -> HostState:
        return aggregate_host(
            self.hosts[host_id],
            (self.vms[v] for v in self.by_host.get(host_id, ())),
            self.cpu_samples.get(host_id, ()),
            self.build_failures.get(host_id, 0),
        )

    def record_load(self, report: HostReport) -> None:
        when = report.reported_at.timestamp() if report.reported_at is not None else time.time()
        samples = self.cpu_samples.setdefault(report.host_id, [])
        samples.append((when, report.cpu_usage_pct))
        del samples[:-CPU_SAMPLES_KEPT]


def _host_change(c: _Cluster, report: HostReport) -> StateWrite:
    c.put_host(report)
    c.record_load(report)
    return StateWrite(kind="host", hosts=[report.host_id])


def _vm_change(c: _Cluster, report: VmReport) -> StateWrite:
    old = c.drop_vm(report.vm_id)
    touched = {old.host_id} if old is not None and old.host_id is not None else set()
    write = StateWrite(kind="vm")
    if counts_on_host(report):
        assert report.host_id is not None
        c.put_vm(report)
        touched.add(report.host_id)
        write.vms_set.append(report)
    else:
        write.vms_deleted.append(report.vm_id)
    # Nova's build-failure counter: failed starts since the host's last successful one.
    if report.host_id is not None and report.status is VmStatus.FAILED:
        c.build_failures[report.host_id] = c.build_failures.get(report.host_id, 0) + 1
        touched.add(report.host_id)
    elif report.host_id is not None and report.status is VmStatus.RUNNING and c.build_failures.pop(report.host_id, 0):
        touched.add(report.host_id)
    # A host with no report yet has no HostState; its VMs are counted once it reports.
    write.hosts = sorted(h for h in touched if h in c.hosts)
    return write


class StateWriter:
    """Applies engine reports to the cluster state (the state-tracker service only).

    Each `apply_*` returns the cluster's new version, exactly one more than before.
    Calls for one cluster are serialized; different clusters proceed concurrently.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        keys: Keys | None = None,
        changes_maxlen: int = STATE_CHANGES_MAXLEN,
        recover: Recover | None = None,
    ) -> None:
        self._redis = redis
        #: Called when the cluster's generation is found lost; without it, GenerationLost is raised.
        self._recover = recover
        self._keys = keys or Keys.from_settings(settings)
        self._maxlen = changes_maxlen
        #: A write that completes a resync opens the replay window for as long as decisions are kept.
        self._replay_window_ms = max(1, int(settings.decision_ttl_s * 1000))
        self._apply = redis.register_script(APPLY)
        self._remove_cluster = redis.register_script(REMOVE_CLUSTER)
        self._clusters: dict[str, _Cluster] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: Clusters this writer has put in the clusters set (see _list).
        self._listed: set[str] = set()

    # ------------------------------------------------------------------ loading
    async def load(self, cluster_ids: Iterable[str] | None = None) -> list[str]:
        """Load clusters from Redis (default: every cluster in the clusters set); returns the ids of
        those it could read (an unreadable one is logged and skipped).

        Host aggregates are recomputed from the stored VMs; a host whose stored aggregates differ
        (written by an older version of this code) is rewritten, as one more version.
        """
        if cluster_ids is None:
            members = await self._redis.smembers(self._keys.clusters())
            ids = sorted(_text(m) for m in members)
        else:
            ids = list(cluster_ids)
        loaded: list[str] = []
        for cid in ids:
            async with self._lock(cid):
                try:
                    cluster, stored = await self._read(cid)
                except (ValidationError, ValueError) as exc:
                    # One unreadable cluster must not keep the tracker from serving the others: it
                    # stays unloaded, and each report for it is refused (dead-lettered) with this reason.
                    log.error("stored cluster unreadable; not loaded", cluster=cid, error=str(exc)[:2000])
                    continue
                loaded.append(cid)
                self._clusters[cid] = cluster
                stale = [h for h in sorted(cluster.hosts) if stored.get(h) != cluster.host_state(h)]
                if stale:
                    log.info("host aggregates repaired on load", cluster=cid, hosts=stale)
                    try:
                        committed = await self._commit(cluster, StateWrite(kind="repair", hosts=stale))
                    except GenerationLost:
                        committed = None  # Redis forgot it: the next apply recovers it
                    if committed is None:
                        # Redis moved on while loading: drop it; the next apply reloads.
                        self._clusters.pop(cid, None)
        return loaded

    # ------------------------------------------------------------------ applying reports
    async def apply_cluster(self, report: ClusterReport) -> int:
        def change(c: _Cluster) -> StateWrite:
            c.settings = report
            return StateWrite(kind="cluster", settings=report)

        return await self._apply_change(report.cluster_id, change)

    async def apply_host(self, report: HostReport) -> int:
        return await self._apply_change(report.cluster_id, lambda c: _host_change(c, report))

    async def apply_vm(self, report: VmReport) -> int:
        """A VM that counts (starting, running, migrating on a host) is stored and counted on its
        host; any other status removes it. A VM that moved updates both hosts."""
        return await self._apply_change(report.cluster_id, lambda c: _vm_change(c, report))

    async def apply_reports(self, cluster_id: str, reports: Sequence[HostReport | VmReport]) -> int:
        """Apply a run of one cluster's host and VM reports in order, as one commit and one version:
        the state stored is the one applying them one at a time leaves (vmsched.store.state_batch).
        Returns the new version (the current one for an empty run)."""
        if any(r.cluster_id != cluster_id for r in reports):
            raise ValueError(f"a run applied to cluster {cluster_id} has reports of another cluster")
        if not reports:
            return self.version(cluster_id)

        def change(c: _Cluster) -> StateWrite:
            writes: list[StateWrite] = []
            counts: list[tuple[int, int]] = []
            for r in reports:
                writes.append(_host_change(c, r) if isinstance(r, HostReport) else _vm_change(c, r))
                counts.append((len(c.hosts), len(c.vms)))
            return merge(writes, counts)

        return await self._apply_change(cluster_id, change)

    # ------------------------------------------------------------------ removing
    async def remove_hosts(self, cluster_id: str, host_ids: Iterable[str]) -> int:
        """Drop hosts and the VMs counted on them, as one new version whose change names the hosts
        (a reader catching up finds their records gone and drops them). Ids the cluster does not
        have are ignored; when it has none of them nothing is written and the version stays.
        Returns the cluster's version after."""
        wanted = set(host_ids)

        def change(c: _Cluster) -> StateWrite | None:
            gone = sorted(h for h in wanted if h in c.hosts)
            if not gone:
                return None
            vms = [vm for h in gone for vm in c.drop_host(h)]
            return StateWrite(kind="host-removed", hosts_deleted=gone, vms_deleted=vms)

        version = await self._apply_change(cluster_id, change)
        c = self._clusters.get(cluster_id)
        if c is not None and not (c.hosts or c.vms or c.settings):
            self._clusters.pop(cluster_id, None)  # an unknown cluster named by mistake: keep nothing of it
        return version

    async def remove_cluster(self, cluster_id: str) -> int:
        """Delete the cluster's state (hosts, VMs, settings, change stream) and forget it: it is
        unknown until reported again, and then its versions go on from past the last one it had.
        Returns the version it had, or 0 if it had no state."""
        async with self._lock(cluster_id):
            self._clusters.pop(cluster_id, None)
            k = self._keys
            had = await self._remove_cluster(
                keys=[
                    k.state_version(cluster_id),
                    k.state_hosts(cluster_id),
                    k.state_vms(cluster_id),
                    k.state_cluster(cluster_id),
                    k.state_changes(cluster_id),
                    k.state_removed(cluster_id),
                ],
            )
            # After the script: a failure here leaves a listed cluster without state, which a
            # retried removal takes out; never a cluster with state that is not listed.
            self._listed.discard(cluster_id)
            await self._redis.srem(k.clusters(), cluster_id)
            return int(had)

    # ------------------------------------------------------------------ reading (memory)
    def version(self, cluster_id: str) -> int:
        c = self._clusters.get(cluster_id)
        return c.version if c is not None else 0

    def cluster_ids(self) -> list[str]:
        """The clusters held in memory."""
        return list(self._clusters)

    def host_counts(self, cluster_id: str) -> dict[HostStatus, int] | None:
        """The cluster's hosts by status (every status, 0 included); None if it is not held."""
        c = self._clusters.get(cluster_id)
        if c is None:
            return None
        return {status: c.statuses[status] for status in HostStatus}

    def host_state(self, cluster_id: str, host_id: str) -> HostState | None:
        c = self._clusters.get(cluster_id)
        if c is None or host_id not in c.hosts:
            return None
        return c.host_state(host_id)

    def snapshot(self, cluster_id: str) -> ClusterState | None:
        """The writer's in-memory view of a loaded cluster (None if not loaded)."""
        c = self._clusters.get(cluster_id)
        if c is None:
            return None
        return ClusterState(
            cluster_id=cluster_id,
            version=c.version,
            settings=c.settings or ClusterReport(cluster_id=cluster_id),
            hosts=[c.host_state(h) for h in sorted(c.hosts)],
            vms=[c.vms[v] for v in sorted(c.vms)],
        )

    # ------------------------------------------------------------------ internals
    def _lock(self, cluster_id: str) -> asyncio.Lock:
        lock = self._locks.get(cluster_id)
        if lock is None:
            lock = self._locks[cluster_id] = asyncio.Lock()
        return lock

    async def _apply_change(self, cluster_id: str, change: Callable[[_Cluster], StateWrite | None]) -> int:
        async with self._lock(cluster_id):
            try:
                return await self._apply_locked(cluster_id, change)
            except GenerationLost:
                self._listed.discard(cluster_id)  # the clusters set went with the rest
                if self._recover is None:
                    raise
            # Redis forgot the cluster: what this writer held of it is of the old generation (the
            # engine re-reports it in full, asked by the recovery). The report goes into the new one.
            await self._recover(cluster_id)
            return await self._apply_locked(cluster_id, change)

    async def _apply_locked(self, cluster_id: str, change: Callable[[_Cluster], StateWrite | None]) -> int:
        for attempt in range(2):
            cluster = self._clusters.get(cluster_id)
            if cluster is None:
                cluster, _ = await self._read(cluster_id)
                self._clusters[cluster_id] = cluster
            # The change mutates the in-memory cluster before Redis has it. Any failure
            # below drops the cluster from memory, so the next apply reloads what Redis holds.
            try:
                write = change(cluster)
                if write is None:  # nothing changed: no version
                    return cluster.version
                version = await self._commit(cluster, write)
            except BaseException:
                self._clusters.pop(cluster_id, None)
                raise
            if version is not None:
                return version
            self._clusters.pop(cluster_id, None)
            log.warning("state version moved under the writer; reloading", cluster=cluster_id, attempt=attempt)
        raise StateConflict(
            f"cluster {cluster_id}: state version changed under the writer twice; "
            "is a second state tracker writing this cluster?",
            location=f"cluster.{cluster_id}",
        )

    async def _commit(self, c: _Cluster, w: StateWrite) -> int | None:
        """Write one change; the new version, or None if Redis was not at c.version."""
        args: list[str | int] = [
            c.version,
            self._maxlen,
            c.cluster_id,
            w.settings.model_dump_json() if w.settings is not None else "",
            w.kind,
            json.dumps(w.hosts + w.hosts_deleted),
            len(w.hosts),
        ]
        for h in w.hosts:
            args += [h, c.host_state(h).model_dump_json()]
        args.append(len(w.vms_set))
        for vm in w.vms_set:
            args += [vm.vm_id, vm.model_dump_json()]
        args.append(len(w.vms_deleted))
        args += w.vms_deleted
        args.append(len(w.hosts_deleted))
        args += w.hosts_deleted
        args.append(self._replay_window_ms)
        args.append(len(w.earlier_counts))
        for hosts, vms in w.earlier_counts:
            args += [hosts, vms]
        cid = c.cluster_id
        await self._list(cid, again=counter_of(c.version) == 0)
        ok, version = await self._apply(
            keys=[
                self._keys.state_version(cid),
                self._keys.state_hosts(cid),
                self._keys.state_vms(cid),
                self._keys.state_cluster(cid),
                self._keys.state_changes(cid),
                self._keys.state_removed(cid),
                self._keys.generation(cid),
                self._keys.resync(cid),
            ],
            args=args,
        )
        if ok == GENERATION_LOST:
            raise GenerationLost(
                f"Redis no longer holds cluster {cid}'s generation: its state from before cannot be trusted",
                location=f"cluster.{cid}",
                cluster_id=cid,
            )
        if not ok:
            return None
        c.version = int(version)
        return c.version

    async def _list(self, cluster_id: str, *, again: bool) -> None:
        """Put the cluster in the clusters set before its first write by this writer (`again`: also
        when Redis had no state of it, which a Redis that lost data may have). Not in the apply
        script: the set is shared by every cluster, so on Redis Cluster it lives in another slot
        than the cluster's keys, and a script must not touch keys of two slots."""
        if again or cluster_id not in self._listed:
            await self._redis.sadd(self._keys.clusters(), cluster_id)
            self._listed.add(cluster_id)

    async def _read(self, cluster_id: str) -> tuple[_Cluster, dict[str, HostState]]:
        """The cluster as Redis holds it (empty at version 0 if unknown), and the stored HostStates."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._keys.state_version(cluster_id))
            pipe.get(self._keys.state_cluster(cluster_id))
            pipe.hgetall(self._keys.state_hosts(cluster_id))
            pipe.hgetall(self._keys.state_vms(cluster_id))
            pipe.get(self._keys.state_removed(cluster_id))
            pipe.get(self._keys.generation(cluster_id))
            raw_version, raw_settings, raw_hosts, raw_vms, removed_at, marker = await pipe.execute()
        # A removed cluster reported again goes on from its old versions, and a new generation from
        # its base (state_scripts.APPLY); whether the marker is this server run's, APPLY checks.
        version = raw_version if raw_version is not None else removed_at
        base = stamp(int(_text(marker).split()[0]), 0) if marker is not None else 0
        c = _Cluster(cluster_id=cluster_id, version=max(base, int(version) if version is not None else 0))
        if raw_settings is not None:
            c.settings = parse_stored(ClusterReport, raw_settings)
        stored: dict[str, HostState] = {}
        for host_id, blob in raw_hosts.items():
            state = parse_stored(HostState, blob)
            stored[_text(host_id)] = state
            c.put_host(state.report)
            if state.cpu_samples:
                c.cpu_samples[_text(host_id)] = list(state.cpu_samples)
            if state.build_failures:
                c.build_failures[_text(host_id)] = state.build_failures
        for blob in raw_vms.values():
            vm = parse_stored(VmReport, blob)
            if counts_on_host(vm):
                c.put_vm(vm)
        return c, stored


__all__ = ["CPU_SAMPLES_KEPT", "StateWriter"]
