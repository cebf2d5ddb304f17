"""The Lua scripts over a cluster's state in Redis: the writer's apply, the readers' catch-up.

Layout per cluster (key names in vmsched.store.keys):

- state:version   an integer, +1 per commit (one report, or a run of them: store.state_batch);
- state:hosts     hash host_id -> HostState JSON (the last report plus what its VMs add up to);
- state:vms       hash vm_id -> VmReport JSON of the VMs that count (starting, running, migrating);
- state:cluster   ClusterReport JSON (cluster-wide settings);
- state:changes   stream, one entry per version, id "<version>-0", fields `hosts` (JSON list of the
                  host ids whose HostState changed or that were removed), `cluster` ("1" if the
                  settings changed), `kind`;
- state:removed   the version a removed cluster had reached, plus one: a cluster reported again
                  after its removal goes on from there, so its versions never repeat an earlier
                  one (a worker's cache of the old cluster can then never pass for the new one).

Every apply writes all of that in one Lua script, so a reader never sees a version whose changes
are half written, and a reader that has version v catches up by reading the stream from v+1 and
only the hosts it names.
"""

from __future__ import annotations

from vmsched.store.generations import CHECK_GENERATION, GENERATION_LOST, SETTLE_RESYNC

# KEYS: [1] version, [2] hosts, [3] vms, [4] cluster settings, [5] changes,
#       [6] removed (the version a removed cluster goes on from), [7] generation marker,
#       [8] resync flag
# The clusters set is not a key here: it is shared by all clusters, so in another Redis Cluster
# slot than these; the writer adds the cluster to it before the first apply (StateWriter._list).
# ARGV: [1] expected version, [2] stream maxlen, [3] cluster id, [4] settings JSON or '',
#       [5] kind, [6] changed or removed host ids (JSON list), [7] number of host pairs, host_id,
#       json, ..., then number of vm pairs, vm_id, json, ..., then number of vm deletions, vm_id,
#       ..., then number of host deletions, host_id, ...
#       then the replay window (ms) of a resync that this write completes, then the number of
#       earlier (hosts, VMs) counts of a merged write, their offsets from the final ones, ...
#       (store.state_batch: a resync settles if it would have after any report of the run).
# Returns {1, new version} or {0, current version} when the expected version is not current, or
# {GENERATION_LOST, 0} when Redis forgot the cluster's generation (store.generations). Versions
# are stamps of the generation: the first write of a new generation goes on from its base.
APPLY = (
    CHECK_GENERATION
    + SETTLE_RESYNC
    + f"""
local base = generation_base(KEYS[7])
if not base then
  return {{{GENERATION_LOST}, 0}}
end
local cur = tonumber(redis.call('GET', KEYS[1]) or redis.call('GET', KEYS[6]) or '0')
if cur < base then
  cur = base
end
if cur ~= tonumber(ARGV[1]) then
  return {{0, cur}}
end
local v = cur + 1
if v - base >= STAMP_SPAN then
  return {{{GENERATION_LOST}, 0}}
end"""
    + """
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
n = tonumber(ARGV[i] or '0'); i = i + 1
for _ = 1, n do
  redis.call('HDEL', KEYS[2], ARGV[i]); i = i + 1
end
local settings_changed = '0'
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[4], ARGV[4])
  settings_changed = '1'
end
local vs = string.format('%d', v)
redis.call('SET', KEYS[1], vs)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[2], vs .. '-0',
  'hosts', ARGV[6], 'cluster', settings_changed, 'kind', ARGV[5])
local window = ARGV[i]; i = i + 1
local earlier = {}
n = tonumber(ARGV[i] or '0'); i = i + 1
for k = 1, 2 * n do
  earlier[k] = tonumber(ARGV[i]); i = i + 1
end
settle_resync(KEYS[8], KEYS[2], KEYS[3], window, earlier)
return {1, v}
"""
)

# KEYS: [1] version, [2] hosts, [3] vms, [4] cluster settings, [5] changes, [6] removed
# Deletes the cluster's state and notes the version it goes on from if reported again (the writer
# then takes the cluster out of the clusters set).
# Returns the version the cluster had, or 0 if it had none (unknown, or removed already).
REMOVE_CLUSTER = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('SET', KEYS[6], string.format('%d', tonumber(cur) + 1))
return tonumber(cur)
"""

# KEYS: [1] version, [2] changes, [3] hosts, [4] cluster settings
# ARGV: [1] the reader's version, [2] the most changes it replays
# Returns {-1} for an unknown cluster; {v, 0} when the reader must reload in full; else
# {v, 1, changed host ids, their HostState JSON (nil if gone), settings changed 0/1, settings JSON}.
# One script, so the hosts read are exactly those of version v, not of a later one.
CATCH_UP = """
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
local first = string.format('%d-0', since + 1)
local entries = redis.call('XRANGE', KEYS[2], first, string.format('%d-0', v))
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

__all__ = ["APPLY", "CATCH_UP", "REMOVE_CLUSTER"]
