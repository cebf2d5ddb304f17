"""Knowing when Redis forgot: per-cluster generation markers, and the stamps ordered by them.

Redis may lose what it holds (a restart without persistence, a restart that lost its last second
of AOF writes, a failover to a replica that missed writes). Counters kept there (fencing tokens,
state versions, pending versions) would then start again, or step back, and repeat values issued
before the loss: a holder frozen across the loss would pass the fence, and a worker's cached table
would look newer than the new state. So every cluster's counters live in a *generation*:

* the generation is a durable counter in PostgreSQL (vmsched.db.generations), advanced each time a
  cluster's marker is found missing or written on another server run;
* the marker, `{prefix}:generation:{cluster}`, holds "<generation> <run id>": the generation and
  the `run_id` of the Redis server that holds it. A restart (with or without data) or a failover
  gives the server a new run id, so a marker from before is no longer "ours" even if it survived;
* every counter value is a *stamp*, generation * 2**STAMP_BITS + counter: compared as plain
  integers, stamps order by (generation, counter), so everything issued in a later generation is
  newer than anything of an earlier one, whatever the counters did.

The scripts that issue counter values (the lock's fencing token, the state writer's version)
check the marker first (CHECK_GENERATION) and refuse with GENERATION_LOST when it is not ours;
the caller then advances the generation (vmsched.recovery) and the cluster is resynchronised from
the engine before it is scheduled again (the resync flag).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from vmsched.errors import FencedOut
from vmsched.settings import Settings
from vmsched.store.keys import Keys
from vmsched.store.redis import text

#: Bits of a stamp given to the counter: 2**36 (68.7 billion) values per generation; the scripts
#: refuse to go past it (GENERATION_LOST), which starts a new generation. Stamps stay below 2**53,
#: exact in Lua's doubles and in JSON, for generations below 2**17.
STAMP_BITS = 36
STAMP_SPAN = 1 << STAMP_BITS
MAX_GENERATION = (1 << (53 - STAMP_BITS)) - 1

#: What a checking script returns first when the marker is not ours (missing, or another run's).
GENERATION_LOST = -7
#: What the lock's acquire script returns first while the cluster waits for the engine's full report.
RESYNCING = -8


#: What a store calls when a script finds a cluster's generation lost: start a new generation (the
#: wiring's vmsched.recovery.Recovery, backed by PostgreSQL), after which the script is run again.
Recover = Callable[[str], Awaitable[None]]


def stamp(generation: int, counter: int) -> int:
    """The stamp of `counter` in `generation`: ordered by (generation, counter) as an integer."""
    if not 0 <= counter < STAMP_SPAN:
        raise ValueError(f"counter {counter} outside 0..{STAMP_SPAN - 1}")
    if not 0 <= generation <= MAX_GENERATION:
        raise ValueError(f"generation {generation} outside 0..{MAX_GENERATION}")
    return generation * STAMP_SPAN + counter


def generation_of(value: int) -> int:
    """The generation a stamp was issued in (0 for values from before generations existed)."""
    return value >> STAMP_BITS


def counter_of(value: int) -> int:
    return value & (STAMP_SPAN - 1)


# A Lua prelude shared by the scripts that issue stamps. `generation_base(marker_key)` returns the
# stamp base of the cluster's generation (generation * STAMP_SPAN), or nil when the marker is
# missing or was written on another server run (Redis forgot, or this is another server).
CHECK_GENERATION = f"""
local function generation_base(marker_key)
  local marker = redis.call('GET', marker_key)
  if not marker then
    return nil
  end
  local gen, run = string.match(marker, '^(%d+) (%x+)$')
  if not gen then
    return nil
  end
  local info = redis.call('INFO', 'server')
  if string.match(info, 'run_id:(%x+)') ~= run then
    return nil
  end
  return tonumber(gen) * {STAMP_SPAN}
end
local STAMP_SPAN = {STAMP_SPAN}
"""

# KEYS[1] marker, KEYS[2] resync flag; ARGV[1] generation, ARGV[2] '1' when the engine owes a full
# report. Installs the marker unless one of this server run with a generation at least as new is
# there already (another process recovered first). Returns the marker's generation after.
_INSTALL = (
    CHECK_GENERATION
    + """
local base = generation_base(KEYS[1])
local wanted = tonumber(ARGV[1])
if base and base / STAMP_SPAN >= wanted then
  return base / STAMP_SPAN
end
local info = redis.call('INFO', 'server')
local run = string.match(info, 'run_id:(%x+)')
redis.call('SET', KEYS[1], string.format('%d %s', wanted, run))
if ARGV[2] == '1' then
  redis.call('SET', KEYS[2], string.format('%d', wanted))
else
  redis.call('DEL', KEYS[2])
end
return wanted
"""
)

# The resync flag's values: "<generation>" while the engine owes its full report; "<generation>
# <hosts> <vms>" once it said it sent one that big and reports are still on their way; "<generation>
# done" (expiring with the decisions of before the loss) once the state holds it: requests may be
# decided again, but a request id Redis forgot is checked against where the engine says its VM is.
RESYNC_DONE = "done"

# Lua for state_scripts.APPLY and _COMPLETE: once the state holds as many hosts and VMs as the
# engine's full report, the resync is over (the flag turns "done" for the replay window, ms).
SETTLE_RESYNC = """
local function settle_resync(flag_key, hosts_key, vms_key, replay_window_ms, earlier)
  local flag = redis.call('GET', flag_key)
  if not flag then
    return -1
  end
  local gen, hosts, vms = string.match(flag, '^(%d+) (%d+) (%d+)$')
  if not hosts then
    return -1
  end
  hosts, vms = tonumber(hosts), tonumber(vms)
  local have_hosts, have_vms = redis.call('HLEN', hosts_key), redis.call('HLEN', vms_key)
  local reached = have_hosts >= hosts and have_vms >= vms
  -- earlier: offsets h1, v1, h2, v2, ... of the counts after earlier reports of a merged write.
  for k = 1, #(earlier or {}), 2 do
    reached = reached or (have_hosts + earlier[k] >= hosts and have_vms + earlier[k + 1] >= vms)
  end
  if reached then
    redis.call('SET', flag_key, gen .. ' done', 'PX', replay_window_ms)
    return 1
  end
  return 0
end
"""

# KEYS[1] resync flag, KEYS[2] state hosts, KEYS[3] state VMs; ARGV[1] generation, ARGV[2] hosts,
# ARGV[3] VMs the engine says its full report held, ARGV[4] the replay window (ms). Returns -1 when
# the flag awaits another generation (or nothing), 1 when the state holds as many hosts and VMs
# (resync over), 0 when reports are still on their way (state_scripts.APPLY settles it later).
_COMPLETE = (
    SETTLE_RESYNC
    + """
local flag = redis.call('GET', KEYS[1])
if not flag or string.match(flag, '^(%d+)') ~= ARGV[1] or string.match(flag, 'done$') then
  return -1
end
redis.call('SET', KEYS[1], string.format('%s %d %d', ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])))
return settle_resync(KEYS[1], KEYS[2], KEYS[3], ARGV[4])
"""
)


@dataclass(frozen=True)
class Marker:
    """A cluster's marker as read: its generation (None: missing or not this server run's) and
    whether the cluster waits for the engine's full report."""

    generation: int | None
    resyncing: bool


class GenerationMarkers:
    """The per-cluster generation markers and resync flags in Redis."""

    def __init__(self, redis: aioredis.Redis, settings: Settings, *, keys: Keys | None = None) -> None:
        self._redis = redis
        self._keys = keys or Keys.from_settings(settings)
        #: The Redis namespace these markers live in: generations are counted per namespace.
        self.prefix = self._keys.prefix
        #: How long after a resync a request id without a stored decision is checked against the
        #: state: as long as decisions made before the loss would have been kept.
        self.replay_window_ms = max(1, int(settings.decision_ttl_s * 1000))
        self._install = redis.register_script(_INSTALL)
        self._complete = redis.register_script(_COMPLETE)
        self._check = redis.register_script(
            CHECK_GENERATION
            + """
local base = generation_base(KEYS[1])
local flag = redis.call('GET', KEYS[2])
local resyncing = 0
if flag and not string.match(flag, 'done$') then
  resyncing = 1
end
if not base then
  return {-1, resyncing}
end
return {base / STAMP_SPAN, resyncing}
"""
        )

    async def install(self, cluster_id: str, generation: int, *, resync: bool) -> int:
        """Mark the cluster's keys as of `generation` on this server run (and, with `resync`, owing
        a full report), unless a marker at least as new is there. Returns the marker's generation."""
        k = self._keys
        got = await self._install(keys=[k.generation(cluster_id), k.resync(cluster_id)], args=[generation, int(resync)])
        return int(got)

    async def read(self, cluster_id: str) -> Marker:
        k = self._keys
        gen, resyncing = await self._check(keys=[k.generation(cluster_id), k.resync(cluster_id)])
        return Marker(None if int(gen) < 0 else int(gen), bool(resyncing))

    async def resync_generation(self, cluster_id: str) -> int | None:
        """The generation whose full report the cluster waits for, or None if it waits for none."""
        raw = await self._redis.get(self._keys.resync(cluster_id))
        if raw is None or text(raw).endswith(RESYNC_DONE):
            return None
        return int(text(raw).split()[0])

    async def complete(self, cluster_id: str, generation: int, hosts: int, vms: int) -> int:
        """The engine's full report for `generation` is sent, with `hosts` hosts and `vms` VMs:
        1 resync over, 0 waiting for reports still on their way, -1 not the awaited generation."""
        k = self._keys
        return int(
            await self._complete(
                keys=[k.resync(cluster_id), k.state_hosts(cluster_id), k.state_vms(cluster_id)],
                args=[generation, hosts, vms, self.replay_window_ms],
            )
        )


def fenced_out(what: str, cluster_id: str, token: int | None, latest: int) -> FencedOut:
    """`what` (a write to `cluster_id`) refused: `token` is no longer the cluster's latest stamp."""
    return FencedOut(
        f"{what} refused: token {token} is not the latest of cluster {cluster_id} ({latest}); "
        "the lock was lost and acquired again",
        location=f"cluster.{cluster_id}",
    )


__all__ = [
    "CHECK_GENERATION",
    "GENERATION_LOST",
    "MAX_GENERATION",
    "RESYNCING",
    "RESYNC_DONE",
    "SETTLE_RESYNC",
    "STAMP_BITS",
    "STAMP_SPAN",
    "GenerationMarkers",
    "Marker",
    "Recover",
    "counter_of",
    "fenced_out",
    "generation_of",
    "stamp",
]
