"""Cluster state in Redis: written by the state tracker, read (and cached) by every worker.

Layout per cluster (key names in vmsched.store.keys):

- state:version   an integer, +1 per applied report;
- state:hosts     hash host_id -> HostState JSON (the last report plus what its VMs add up to);
- state:vms       hash vm_id -> VmReport JSON of the VMs that count (starting, running, migrating);
- state:cluster   ClusterReport JSON (cluster-wide settings);
- state:changes   stream, one entry per version, id "<version>-0", fields `hosts` (JSON list of the
                  host ids whose HostState changed), `cluster` ("1" if the settings changed), `kind`.

Every apply writes all of that in one Lua script, so a reader never sees a version whose changes
are half written, and a reader that has version v catches up by reading the stream from v+1 and
only the hosts it names.

Writers: exactly one state-tracker process writes a given cluster (the state tracker consumes
one durable queue, in order). The writer keeps the cluster in memory and derives host aggregates
from it; it loads from Redis at start (so state survives a tracker restart). As a guard, not as a
way to run several writers, each write names the version it was computed from and is refused if
Redis has moved on; the writer then reloads the cluster and applies the report once more (reports
are absolute states, so applying one again is harmless).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import redis.asyncio as aioredis
from pydantic import ValidationError

from vmsched.constants import STATE_CHANGES_MAXLEN
from vmsched.contracts import ClusterReport, ClusterState, HostReport, HostState, Message, VmReport, VmStatus
from vmsched.errors import StaleState, StateConflict, UnknownCluster
from vmsched.logging import get_logger
from vmsched.scheduling.cost import vm_cost
from vmsched.scheduling.hosts import HostTable
from vmsched.settings import Settings
from vmsched.store._aio import cancel_requests, raise_if_cancelled
from vmsched.store.keys import Keys
from vmsched.store.redis import text as _text

log = get_logger(__name__)

#: VM states that use resources on their host. A migrating VM counts on the host it is reported
#: on (VmReport has one host); the engine reports the destination once the migration ends.
#: CPU load reports kept per host: enough for CpuOverCommitDurationMinutes at a report every
#: few seconds; the CPUOverloaded filter needs the run of reports over its threshold.
CPU_SAMPLES_KEPT = 120

COUNTED_STATUSES: frozenset[VmStatus] = frozenset({VmStatus.STARTING, VmStatus.RUNNING, VmStatus.MIGRATING})

#: A reader further behind than this many versions reloads in full instead of replaying changes.
MAX_CATCH_UP = 2_000

#: How long StateCache.table waits for a version it was asked for before raising StaleState.
STALE_WAIT_S = 1.0


# KEYS: [1] version, [2] hosts, [3] vms, [4] cluster settings, [5] changes, [6] clusters set
# ARGV: [1] expected version, [2] stream maxlen, [3] cluster id, [4] settings JSON or '',
#       [5] kind, [6] changed host ids (JSON list), [7] number of host pairs, host_id, json, ...,
#       then number of vm pairs, vm_id, json, ..., then number of vm deletions, vm_id, ...
# Returns {1, new version} or {0, current version} when the expected version is not current.
_APPLY = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur ~= tonumber(ARGV[1]) then
  return {0, cur}
end
local v = cur + 1
local last = redis.call('XREVRANGE', KEYS[5], '+', '-', 'COUNT', 1)
if #last > 0 and tonumber(string.match(last[1][1], '^(%d+)')) >= v then
  -- The stream is ahead of the version key (the key was lost): readers must reload in full,
  -- and XADD below would fail after the other writes, which a script cannot undo.
  redis.call('DEL', KEYS[5])
end
local i = 7
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]); i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]); i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  redis.call('HDEL', KEYS[3], ARGV[i]); i = i + 1
end
local settings_changed = '0'
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[4], ARGV[4])
  settings_changed = '1'
end
redis.call('SET', KEYS[1], v)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[2], v .. '-0',
  'hosts', ARGV[6], 'cluster', settings_changed, 'kind', ARGV[5])
redis.call('SADD', KEYS[6], ARGV[3])
return {1, v}
"""

# KEYS: [1] version, [2] changes, [3] hosts, [4] cluster settings
# ARGV: [1] the reader's version, [2] the most changes it replays
# Returns {-1} for an unknown cluster; {v, 0} when the reader must reload in full; else
# {v, 1, changed host ids, their HostState JSON (nil if gone), settings changed 0/1, settings JSON}.
# One script, so the hosts read are exactly those of version v, not of a later one.
_CATCH_UP = """
local v = redis.call('GET', KEYS[1])
if not v then
  return {-1}
end
v = tonumber(v)
local since = tonumber(ARGV[1])
if v < since or v - since > tonumber(ARGV[2]) then
  return {v, 0}
end
if v == since then
  return {v, 1, {}, {}, 0, false}
end
local first = (since + 1) .. '-0'
local entries = redis.call('XRANGE', KEYS[2], first, v .. '-0')
if #entries ~= v - since or entries[1][1] ~= first then
  return {v, 0}
end
local seen, hosts, settings_changed = {}, {}, 0
for _, e in ipairs(entries) do
  local f = e[2]
  for j = 1, #f, 2 do
    if f[j] == 'hosts' then
      for _, h in ipairs(cjson.decode(f[j + 1])) do
        if not seen[h] then
          seen[h] = true
          hosts[#hosts + 1] = h
        end
      end
    elseif f[j] == 'cluster' and f[j + 1] == '1' then
      settings_changed = 1
    end
  end
end
local values = {}
for s = 1, #hosts, 500 do
  local chunk = {}
  for k = s, math.min(s + 499, #hosts) do
    chunk[#chunk + 1] = hosts[k]
  end
  local got = redis.call('HMGET', KEYS[3], unpack(chunk))
  for k = 1, #chunk do
    values[#values + 1] = got[k]
  end
end
local settings = false
if settings_changed == 1 then
  settings = redis.call('GET', KEYS[4])
end
return {v, 1, hosts, values, settings_changed, settings}
"""


def _counts(vm: VmReport) -> bool:
    return vm.status in COUNTED_STATUSES and vm.host_id is not None


def _host_state(
    report: HostReport,
    vms: Iterable[VmReport],
    cpu_samples: Sequence[tuple[float, float]] = (),
    build_failures: int = 0,
) -> HostState:
    """A host's report plus the aggregates of the VMs that count on it (oVirt's mem_commited etc.)
    and what the tracker remembers of it (load history, failed starts)."""
    vm_count = mem = vcpus = pinned = ha = 0
    vms = list(vms)
    for vm in vms:
        vm_count += 1
        cost = vm_cost(vm)
        mem += cost.mem_mb
        vcpus += cost.vcpus
        pinned += cost.cpus_pinned
        if vm.ha:
            ha += 1
    return HostState(
        report=report,
        vm_count=vm_count,
        mem_committed_mb=mem,
        vcpus_committed=vcpus,
        cpus_pinned=pinned,
        ha_vm_count=ha,
        vm_ids=sorted(vm.vm_id for vm in vms),
        cpu_samples=list(cpu_samples),
        build_failures=build_failures,
    )


M = TypeVar("M", bound=Message)


def _stored(model: type[M], raw: bytes | str) -> M:
    """Parse a record that this or an older version stored.

    Messages on the wire refuse unknown fields; stored state must survive an upgrade that removed
    one, or the state tracker could not load its clusters at all. Fields the model no longer has
    are dropped with a warning; any other problem still raises.
    """
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors()
        if not errors or any(e["type"] != "extra_forbidden" for e in errors):
            raise
        data = json.loads(raw)
        for e in errors:
            node = data
            for part in e["loc"][:-1]:
                node = node[part]
            node.pop(e["loc"][-1], None)
        log.warning(
            "stored record has fields this version does not know: dropped",
            model=model.__name__,
            fields=[".".join(str(p) for p in e["loc"]) for e in errors],
        )
        return model.model_validate(data)


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

    def host_state(self, host_id: str) -> HostState:
        return _host_state(
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


@dataclass
class _Write:
    """What one apply changes in Redis."""

    kind: str
    hosts: list[str] = field(default_factory=list)
    vms_set: list[VmReport] = field(default_factory=list)
    vms_deleted: list[str] = field(default_factory=list)
    settings: ClusterReport | None = None


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
    ) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self._maxlen = changes_maxlen
        self._apply = redis.register_script(_APPLY)
        self._clusters: dict[str, _Cluster] = {}
        self._locks: dict[str, asyncio.Lock] = {}

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
                    if await self._commit(cluster, _Write(kind="repair", hosts=stale)) is None:
                        # Redis moved on while loading: drop it; the next apply reloads.
                        self._clusters.pop(cid, None)
        return loaded

    # ------------------------------------------------------------------ applying reports
    async def apply_cluster(self, report: ClusterReport) -> int:
        def change(c: _Cluster) -> _Write:
            c.settings = report
            return _Write(kind="cluster", settings=report)

        return await self._apply_change(report.cluster_id, change)

    async def apply_host(self, report: HostReport) -> int:
        def change(c: _Cluster) -> _Write:
            c.hosts[report.host_id] = report
            c.record_load(report)
            return _Write(kind="host", hosts=[report.host_id])

        return await self._apply_change(report.cluster_id, change)

    async def apply_vm(self, report: VmReport) -> int:
        """A VM that counts (starting, running, migrating on a host) is stored and counted on its
        host; any other status removes it. A VM that moved updates both hosts."""

        def change(c: _Cluster) -> _Write:
            old = c.drop_vm(report.vm_id)
            touched = {old.host_id} if old is not None and old.host_id is not None else set()
            write = _Write(kind="vm")
            if _counts(report):
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
            elif (
                report.host_id is not None
                and report.status is VmStatus.RUNNING
                and c.build_failures.pop(report.host_id, 0)
            ):
                touched.add(report.host_id)
            # A host with no report yet has no HostState; its VMs are counted once it reports.
            write.hosts = sorted(h for h in touched if h in c.hosts)
            return write

        return await self._apply_change(report.cluster_id, change)

    # ------------------------------------------------------------------ reading (memory)
    def version(self, cluster_id: str) -> int:
        c = self._clusters.get(cluster_id)
        return c.version if c is not None else 0

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

    async def _apply_change(self, cluster_id: str, change: Callable[[_Cluster], _Write]) -> int:
        async with self._lock(cluster_id):
            for attempt in range(2):
                cluster = self._clusters.get(cluster_id)
                if cluster is None:
                    cluster, _ = await self._read(cluster_id)
                    self._clusters[cluster_id] = cluster
                # The change mutates the in-memory cluster before Redis has it. Any failure
                # below drops the cluster from memory, so the next apply reloads what Redis holds.
                try:
                    write = change(cluster)
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

    async def _commit(self, c: _Cluster, w: _Write) -> int | None:
        """Write one change; the new version, or None if Redis was not at c.version."""
        args: list[str | int] = [
            c.version,
            self._maxlen,
            c.cluster_id,
            w.settings.model_dump_json() if w.settings is not None else "",
            w.kind,
            json.dumps(w.hosts),
            len(w.hosts),
        ]
        for h in w.hosts:
            args += [h, c.host_state(h).model_dump_json()]
        args.append(len(w.vms_set))
        for vm in w.vms_set:
            args += [vm.vm_id, vm.model_dump_json()]
        args.append(len(w.vms_deleted))
        args += w.vms_deleted
        cid = c.cluster_id
        ok, version = await self._apply(
            keys=[
                self._keys.state_version(cid),
                self._keys.state_hosts(cid),
                self._keys.state_vms(cid),
                self._keys.state_cluster(cid),
                self._keys.state_changes(cid),
                self._keys.clusters(),
            ],
            args=args,
        )
        if not ok:
            return None
        c.version = int(version)
        return c.version

    async def _read(self, cluster_id: str) -> tuple[_Cluster, dict[str, HostState]]:
        """The cluster as Redis holds it (empty at version 0 if unknown), and the stored HostStates."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._keys.state_version(cluster_id))
            pipe.get(self._keys.state_cluster(cluster_id))
            pipe.hgetall(self._keys.state_hosts(cluster_id))
            pipe.hgetall(self._keys.state_vms(cluster_id))
            raw_version, raw_settings, raw_hosts, raw_vms = await pipe.execute()
        c = _Cluster(cluster_id=cluster_id, version=int(raw_version) if raw_version is not None else 0)
        if raw_settings is not None:
            c.settings = _stored(ClusterReport, raw_settings)
        stored: dict[str, HostState] = {}
        for host_id, blob in raw_hosts.items():
            state = _stored(HostState, blob)
            stored[_text(host_id)] = state
            c.hosts[_text(host_id)] = state.report
            if state.cpu_samples:
                c.cpu_samples[_text(host_id)] = [tuple(x) for x in state.cpu_samples]  # type: ignore[misc]
            if state.build_failures:
                c.build_failures[_text(host_id)] = state.build_failures
        for blob in raw_vms.values():
            vm = _stored(VmReport, blob)
            if _counts(vm):
                c.put_vm(vm)
        return c, stored


# ====================================================================== readers


def _missing(table: HostTable, host_ids: Iterable[str]) -> list[str]:
    """The ids of `host_ids` the table has no row for, in their order."""
    index = table.index
    return [h for h in host_ids if h not in index]


@dataclass(frozen=True)
class _Cached:
    version: int
    settings: ClusterReport
    hosts: dict[str, HostState]
    table: HostTable


@dataclass
class CacheStats:
    """How the cache got its tables (for metrics and tests)."""

    full_loads: int = 0
    incremental_loads: int = 0
    #: Host records read by incremental catch-ups, in total.
    hosts_fetched: int = 0


class StateCache:
    """Workers' read side: per cluster the latest HostTable seen, caught up incrementally.

    Tables come without pending resources (HostTable.with_pending adds them).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: Settings,
        *,
        keys: Keys | None = None,
        stale_wait_s: float = STALE_WAIT_S,
        max_catch_up: int = MAX_CATCH_UP,
    ) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        self._stale_wait_s = stale_wait_s
        self._max_catch_up = max_catch_up
        self._catch_up = redis.register_script(_CATCH_UP)
        self._cache: dict[str, _Cached] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.stats = CacheStats()

    async def table(self, cluster_id: str, min_version: int | None = None) -> tuple[int, HostTable]:
        """(version, HostTable) of the cluster.

        With `min_version`, a cached table at least that new is returned without asking Redis;
        otherwise the cache catches up, waiting up to `stale_wait_s` for the tracker to reach
        `min_version` (then StaleState). Without it, the current version is read (one GET) and
        the cache catches up if behind. Raises UnknownCluster if no state was ever written.
        """
        cached = self._cache.get(cluster_id)
        if min_version is not None:
            if cached is not None and cached.version >= min_version:
                return cached.version, cached.table
            target = await self._wait_for(cluster_id, min_version)
        else:
            target = await self._current(cluster_id)
            if cached is not None and cached.version >= target:
                return cached.version, cached.table
        async with self._lock(cluster_id):
            # Another caller may have caught up while this one waited for the lock.
            cached = self._cache.get(cluster_id)
            if cached is None or cached.version < target:
                cached = await self._refresh(cluster_id, cached)
                self._cache[cluster_id] = cached
        if min_version is not None and cached.version < min_version:
            # The version went backwards between the wait and the load (the state was lost).
            raise self._not_reached(cluster_id, cached.version, min_version)
        return cached.version, cached.table

    async def table_with(self, cluster_id: str, min_version: int, host_ids: Iterable[str]) -> tuple[int, HostTable]:
        """(version, HostTable) at `min_version` or later that has every host of `host_ids`: the
        state a worker's request was made against.

        The state tracker never removes a host, so a table at that version or later that lacks one
        of the request's hosts is not that state: the cache's copy predates a state that was lost
        and reported again (its version numbers start over). The cache then reloads in full from
        Redis once; if the version or a host is still not there, StaleState says which.
        """
        wanted = list(host_ids)
        version, table = await self.table(cluster_id, min_version=min_version)
        if not _missing(table, wanted):
            return version, table
        async with self._lock(cluster_id):
            cached = await self._full_load(cluster_id)
            self._cache[cluster_id] = cached
        if cached.version < min_version:
            raise self._not_reached(cluster_id, cached.version, min_version)
        missing = _missing(cached.table, wanted)
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise StaleState(
                f"cluster {cluster_id}: hosts {', '.join(missing[:5])}{more} of the request are unknown "
                f"at state version {cached.version} (the request was made against version {min_version}); "
                "the cluster's state was lost or rewritten since",
                location="state_version",
            )
        return cached.version, cached.table

    async def snapshot(self, cluster_id: str) -> ClusterState:
        """The whole cluster at one version, read from Redis (hosts and VMs ordered by id)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._keys.state_version(cluster_id))
            pipe.get(self._keys.state_cluster(cluster_id))
            pipe.hgetall(self._keys.state_hosts(cluster_id))
            pipe.hgetall(self._keys.state_vms(cluster_id))
            raw_version, raw_settings, raw_hosts, raw_vms = await pipe.execute()
        if raw_version is None:
            raise UnknownCluster(f"no state reported for cluster {cluster_id}", location="cluster_id")
        hosts = self._parse_hosts(cluster_id, raw_hosts)
        vms = sorted((_stored(VmReport, b) for b in raw_vms.values()), key=lambda v: v.vm_id)
        return ClusterState(
            cluster_id=cluster_id,
            version=int(raw_version),
            settings=self._parse_settings(cluster_id, raw_settings),
            hosts=[hosts[h] for h in sorted(hosts)],
            vms=vms,
        )

    async def clusters(self) -> list[str]:
        """Every cluster the state tracker has written, sorted."""
        members = await self._redis.smembers(self._keys.clusters())
        return sorted(_text(m) for m in members)

    # ------------------------------------------------------------------ internals
    def _lock(self, cluster_id: str) -> asyncio.Lock:
        lock = self._locks.get(cluster_id)
        if lock is None:
            lock = self._locks[cluster_id] = asyncio.Lock()
        return lock

    async def _current(self, cluster_id: str) -> int:
        raw = await self._redis.get(self._keys.state_version(cluster_id))
        if raw is None:
            self._cache.pop(cluster_id, None)
            raise UnknownCluster(f"no state reported for cluster {cluster_id}", location="cluster_id")
        return int(raw)

    async def _wait_for(self, cluster_id: str, min_version: int) -> int:
        """The current version once it reaches `min_version`; StaleState if it does not in time."""
        deadline = time.monotonic() + self._stale_wait_s
        delay = 0.005
        cancels = cancel_requests()
        while True:
            current = await self._current(cluster_id)
            raise_if_cancelled(cancels)
            if current >= min_version:
                return current
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._not_reached(cluster_id, current, min_version, waited=True)
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)

    def _not_reached(self, cluster_id: str, current: int, min_version: int, *, waited: bool = False) -> StaleState:
        after = f" after waiting {self._stale_wait_s:.1f}s" if waited else ""
        return StaleState(
            f"cluster {cluster_id}: state version {current} has not reached {min_version}{after}",
            location="state_version",
        )

    async def _refresh(self, cluster_id: str, cached: _Cached | None) -> _Cached:
        if cached is None:
            return await self._full_load(cluster_id)
        reply = await self._catch_up(
            keys=[
                self._keys.state_version(cluster_id),
                self._keys.state_changes(cluster_id),
                self._keys.state_hosts(cluster_id),
                self._keys.state_cluster(cluster_id),
            ],
            args=[cached.version, self._max_catch_up],
        )
        version = int(reply[0])
        if version < 0:
            self._cache.pop(cluster_id, None)
            raise UnknownCluster(f"no state reported for cluster {cluster_id}", location="cluster_id")
        if not int(reply[1]):
            # Trimmed stream, a reader far behind, or a version that went backwards (Redis lost it).
            return await self._full_load(cluster_id)
        host_ids: Sequence[bytes] = reply[2]
        blobs: Sequence[bytes | None] = reply[3]
        hosts = dict(cached.hosts)
        for raw_id, blob in zip(host_ids, blobs, strict=True):
            host_id = _text(raw_id)
            if blob is None:
                hosts.pop(host_id, None)
                continue
            try:
                hosts[host_id] = _stored(HostState, blob)
            except ValidationError:
                log.warning("unreadable host state skipped", cluster=cluster_id, host=host_id)
                hosts.pop(host_id, None)
        settings = cached.settings
        if int(reply[4]):
            settings = self._parse_settings(cluster_id, reply[5])
        self.stats.incremental_loads += 1
        self.stats.hosts_fetched += len(host_ids)
        if not host_ids and settings is cached.settings:
            return _Cached(version, settings, hosts, cached.table)
        # Usually one or two hosts changed: replace their rows instead of rebuilding every column.
        changed = {h: hosts[h] for h in (_text(x) for x in host_ids) if h in hosts}
        if len(changed) == len(host_ids):
            table = cached.table.with_rows(changed, settings)
            if table is not None:
                return _Cached(version, settings, hosts, table)
        return self._build(version, settings, hosts)

    async def _full_load(self, cluster_id: str) -> _Cached:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(self._keys.state_version(cluster_id))
            pipe.get(self._keys.state_cluster(cluster_id))
            pipe.hgetall(self._keys.state_hosts(cluster_id))
            raw_version, raw_settings, raw_hosts = await pipe.execute()
        if raw_version is None:
            self._cache.pop(cluster_id, None)
            raise UnknownCluster(f"no state reported for cluster {cluster_id}", location="cluster_id")
        self.stats.full_loads += 1
        return self._build(
            int(raw_version),
            self._parse_settings(cluster_id, raw_settings),
            self._parse_hosts(cluster_id, raw_hosts),
        )

    @staticmethod
    def _build(version: int, settings: ClusterReport, hosts: dict[str, HostState]) -> _Cached:
        # Host order is by id, so a host keeps its position across versions.
        table = HostTable.from_states([hosts[h] for h in sorted(hosts)], settings)
        return _Cached(version, settings, hosts, table)

    @staticmethod
    def _parse_settings(cluster_id: str, raw: bytes | None) -> ClusterReport:
        if raw is None:
            return ClusterReport(cluster_id=cluster_id)
        return _stored(ClusterReport, raw)

    @staticmethod
    def _parse_hosts(cluster_id: str, raw: dict[bytes, bytes]) -> dict[str, HostState]:
        hosts: dict[str, HostState] = {}
        for host_id, blob in raw.items():
            try:
                hosts[_text(host_id)] = _stored(HostState, blob)
            except ValidationError:
                log.warning("unreadable host state skipped", cluster=cluster_id, host=_text(host_id))
        return hosts


__all__ = [
    "COUNTED_STATUSES",
    "MAX_CATCH_UP",
    "STALE_WAIT_S",
    "CacheStats",
    "StateCache",
    "StateWriter",
]
