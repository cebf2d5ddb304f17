"""The cluster state's read side: StateCache, each worker's HostTable per cluster, caught up incrementally.

A cached table at version v catches up by replaying the change stream from v+1 (one Lua script,
vmsched.store.state_scripts.CATCH_UP) and re-reading only the hosts it names; a reader too far
behind, or one whose stream was trimmed or lost, reloads the cluster in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.asyncio.client import Pipeline

from vmsched.contracts import ClusterReport, ClusterState, HostState, VmReport
from vmsched.errors import StaleState, UnknownCluster
from vmsched.logging import get_logger
from vmsched.scheduling.hosts import HostTable
from vmsched.settings import Settings
from vmsched.store._aio import cancel_requests, raise_if_cancelled
from vmsched.store.keys import Keys
from vmsched.store.redis import text as _text
from vmsched.store.state_records import parse_stored
from vmsched.store.state_scripts import CATCH_UP

log = get_logger(__name__)

#: A reader further behind than this many versions reloads in full instead of replaying changes.
MAX_CATCH_UP = 2_000

#: How long StateCache.table waits for a version it was asked for before raising StaleState.
STALE_WAIT_S = 1.0


def _heap_trimmer() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return cast(Callable[[int], int], trim)


#: A full load reads every host record of the cluster at once (8 MB at 10,000 hosts with one CPU
#: sample each, 45 MB with a full history) and frees them while the table is built. glibc keeps
#: that freed memory mapped, and the table's objects live in Python's own arenas, which never
#: reuse it: without a trim the worker's RSS keeps the whole reply until the next full load.
_trim_heap = _heap_trimmer()


def _missing(table: HostTable, host_ids: Iterable[str]) -> list[str]:
    """The ids of `host_ids` the table has no row for, in their order."""
    index = table.index
    return [h for h in host_ids if h not in index]


@dataclass(frozen=True)
class _Cached:
    """A cluster at one version. The table is all that is kept of its hosts: it holds what units
    read, and catching up replaces, adds or drops its rows (HostTable.updated)."""

    version: int
    settings: ClusterReport
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
        self._catch_up = redis.register_script(CATCH_UP)
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
            if cached is not None:
                # Behind: catch up at once (the catch-up reads the current version itself, so the
                # usual case, a tracker already there, costs one round trip rather than two).
                async with self._lock(cluster_id):
                    cached = self._cache.get(cluster_id)
                    if cached is not None and cached.version < min_version:
                        cached = await self._refresh(cluster_id, cached)
                        self._cache[cluster_id] = cached
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

        A table at that version or later that lacks one of the request's hosts is either not that
        state (the cache's copy predates a state that was lost and reported again: its version
        numbers start over) or one where the host was removed since. The cache then reloads in full
        from Redis once; if the version or a host is still not there, StaleState says which.
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
                "they were removed, or the cluster's state was lost or rewritten since",
                location="state_version",
            )
        return cached.version, cached.table

    async def version(self, cluster_id: str) -> int:
        """The cluster's current state version in Redis (one GET); UnknownCluster if none was written."""
        return await self._current(cluster_id)

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
        vms = sorted((parse_stored(VmReport, b) for b in raw_vms.values()), key=lambda v: v.vm_id)
        return ClusterState(
            cluster_id=cluster_id,
            version=int(raw_version),
            settings=self._parse_settings(cluster_id, raw_settings),
            hosts=[hosts[h] for h in sorted(hosts)],
            vms=vms,
        )

    async def placed_vms(self, cluster_id: str, vm_ids: Sequence[str]) -> dict[str, VmReport]:
        """Of `vm_ids`, those the engine reports holding resources on a host (starting, running,
        migrating), with their last report: one HMGET, for the replay check after a loss."""
        if not vm_ids:
            return {}
        raw = await self._redis.hmget(self._keys.state_vms(cluster_id), list(vm_ids))
        return {vm: parse_stored(VmReport, blob) for vm, blob in zip(vm_ids, raw, strict=True) if blob is not None}

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

    async def stored_settings(self, cluster_id: str) -> ClusterReport | None:
        """The cluster's report as the tracker last applied it (None before the first), read from
        Redis now, not from the cache."""
        raw = await self._redis.get(self._keys.state_cluster(cluster_id))
        return parse_stored(ClusterReport, raw) if raw is not None else None

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
        reply = await self._catch_up(keys=self._catch_up_keys(cluster_id), args=[cached.version, self._max_catch_up])
        caught = self._caught_up(cluster_id, cached, reply)
        return caught if caught is not None else await self._full_load(cluster_id)

    def catch_up_into(self, pipe: Pipeline, cluster_id: str) -> int | None:
        """Queue the cached copy's catch-up on `pipe` (store.group_reads; its script's source is
        CATCH_UP); returns the version it catches up from, for `catch_up_from`, or None (nothing
        queued) when nothing is cached."""
        cached = self._cache.get(cluster_id)
        if cached is None:
            return None
        keys = self._catch_up_keys(cluster_id)
        pipe.evalsha(self._catch_up.sha, len(keys), *keys, cached.version, self._max_catch_up)
        return cached.version

    def catch_up_from(self, cluster_id: str, from_version: int, reply: Any) -> None:
        """Apply the reply of `catch_up_into` if the cached copy is still at `from_version` (another
        caller may have moved it meanwhile: then the reply is stale and dropped). A reply that
        needs a full load (or says the cluster is gone) is dropped too: `table` does that as usual."""
        cached = self._cache.get(cluster_id)
        if cached is None or cached.version != from_version or isinstance(reply, Exception):
            return
        with contextlib.suppress(UnknownCluster):
            caught = self._caught_up(cluster_id, cached, reply)
            if caught is not None:
                self._cache[cluster_id] = caught

    def _catch_up_keys(self, cluster_id: str) -> list[str]:
        return [
            self._keys.state_version(cluster_id),
            self._keys.state_changes(cluster_id),
            self._keys.state_hosts(cluster_id),
            self._keys.state_cluster(cluster_id),
        ]

    def _caught_up(self, cluster_id: str, cached: _Cached, reply: Sequence[Any]) -> _Cached | None:
        """`cached` moved on by a catch-up reply; None when only a full load will do."""
        version = int(reply[0])
        if version < 0:
            self._cache.pop(cluster_id, None)
            raise UnknownCluster(f"no state reported for cluster {cluster_id}", location="cluster_id")
        if not int(reply[1]):
            # Trimmed stream, a reader far behind, or a version that went backwards (Redis lost it).
            return None
        host_ids: Sequence[bytes] = reply[2]
        changed, removed = self._read_changes(cluster_id, host_ids, reply[3])
        settings = cached.settings
        if int(reply[4]):
            settings = self._parse_settings(cluster_id, reply[5])
        self.stats.incremental_loads += 1
        self.stats.hosts_fetched += len(host_ids)
        if not host_ids and settings is cached.settings:
            return _Cached(version, settings, cached.table)
        # Usually one or two hosts changed: their rows are replaced instead of every column rebuilt.
        return _Cached(version, settings, cached.table.updated(changed, removed, settings))

    def _read_changes(
        self, cluster_id: str, host_ids: Sequence[bytes], blobs: Sequence[bytes | None]
    ) -> tuple[dict[str, HostState], list[str]]:
        """The changed hosts' states, and the hosts to drop: a missing blob is a removed host; an
        unreadable one is dropped with a warning (as at a full load) rather than failing every request."""
        changed: dict[str, HostState] = {}
        removed: list[str] = []
        for raw_id, blob in zip(host_ids, blobs, strict=True):
            host_id = _text(raw_id)
            if blob is None:
                removed.append(host_id)
                continue
            try:
                changed[host_id] = parse_stored(HostState, blob)
            except ValidationError:
                log.warning("unreadable host state skipped", cluster=cluster_id, host=host_id)
                removed.append(host_id)
        return changed, removed

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
        settings = self._parse_settings(cluster_id, raw_settings)
        # Parsed one host at a time as the table takes them: no model outlives its row.
        table = HostTable.from_states(self._stored_hosts(cluster_id, raw_hosts), settings)
        if _trim_heap is not None:
            _trim_heap(0)
        return _Cached(int(raw_version), settings, table)

    @staticmethod
    def _parse_settings(cluster_id: str, raw: bytes | None) -> ClusterReport:
        if raw is None:
            return ClusterReport(cluster_id=cluster_id)
        return parse_stored(ClusterReport, raw)

    @staticmethod
    def _stored_hosts(cluster_id: str, raw: dict[bytes, bytes]) -> Iterator[HostState]:
        """The readable hosts of `raw` in id order, parsed as they are asked for (host order is by
        id, so a host keeps its position from one version to the next unless hosts are added or
        removed before it). Each record is taken out of `raw` as it is parsed: the memory of the
        records read is reused for the table's rows instead of a load's peak adding up both."""
        for host_id in sorted(raw):
            try:
                yield parse_stored(HostState, raw.pop(host_id))
            except ValidationError:
                log.warning("unreadable host state skipped", cluster=cluster_id, host=_text(host_id))

    @staticmethod
    def _parse_hosts(cluster_id: str, raw: dict[bytes, bytes]) -> dict[str, HostState]:
        hosts: dict[str, HostState] = {}
        for host_id, blob in raw.items():
            try:
                hosts[_text(host_id)] = parse_stored(HostState, blob)
            except ValidationError:
                log.warning("unreadable host state skipped", cluster=cluster_id, host=_text(host_id))
        return hosts


__all__ = ["MAX_CATCH_UP", "STALE_WAIT_S", "CacheStats", "StateCache"]
