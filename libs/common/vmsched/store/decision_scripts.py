"""The Lua scripts of the decision store (store.decisions): each one round trip, over one cluster's
keys (its hash tag), so they run on Redis Cluster as on one server. The record layout and the event
rule they keep are the decision store's docstring; the functions (read, remember, put_decisions) are
shared with the group commit (store.group_writes)."""

from __future__ import annotations

# Defines read(key): {} if absent, {'string', json} for a record of the older layout,
# {'hash', json, fingerprint, published}, or {type} for a key of any other type (not a record).
READ_RECORD = """
local function read(key)
  local t = redis.call('TYPE', key)['ok']
  if t == 'string' then
    return {'string', redis.call('GET', key)}
  end
  if t == 'hash' then
    local v = redis.call('HMGET', key, 'decision', 'fingerprint', 'published')
    return {'hash', v[1] or '', v[2] or '', v[3] or '0'}
  end
  if t == 'none' then
    return {}
  end
  return {t}
end
"""

# Defines remember(history, request id, decided at ms, cap, ttl ms): the request id into the cluster's
# history (a sorted set by decision time), the oldest beyond `cap` dropped, kept at least `ttl`.
REMEMBER = """
local function remember(key, member, score, cap, ttl)
  redis.call('ZADD', key, score, member)
  local n = redis.call('ZCARD', key)
  if n > tonumber(cap) then
    redis.call('ZREMRANGEBYRANK', key, 0, n - tonumber(cap) - 1)
  end
  if redis.call('PTTL', key) < tonumber(ttl) then
    redis.call('PEXPIRE', key, ttl)
  end
end
"""

# KEYS decisions. Returns read(key) of each, in order.
GET_MANY = (
    READ_RECORD
    + """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = read(key)
end
return out
"""
)

# KEYS[1] decision, KEYS[2] the cluster's fence, KEYS[3] the cluster's history; ARGV[1] json,
# ARGV[2] fingerprint, ARGV[3] ttl ms, ARGV[4] fencing token ('' for none), ARGV[5] request id,
# ARGV[6] decided at (ms), ARGV[7] history cap. Returns {1} when stored, {0} when the request id
# already has a decision (kept), {-1, latest token} when fenced out. Running it twice is harmless:
# the second run finds the first one's record.
PUT = (
    REMEMBER
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
if ARGV[4] ~= '' then
  local fence = tonumber(redis.call('GET', KEYS[2]) or '0')
  if fence ~= tonumber(ARGV[4]) then
    return {-1, fence}
  end
end
redis.call('HSET', KEYS[1], 'decision', ARGV[1], 'fingerprint', ARGV[2], 'published', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
remember(KEYS[3], ARGV[5], ARGV[6], ARGV[7], ARGV[3])
return {1}
"""
)

# Defines put_decisions(history, first key, first arg, ttl ms, history cap): decision i in
# KEYS[first key + i - 1], its six arguments from ARGV[first arg + 6 (i - 1)]: json, fingerprint,
# the record it may replace as read() showed it (type, raw json) or '', '' to store only where there
# is none, request id, decided at (ms). The caller has checked the fence. Returns per decision {}
# when stored, read(key) of the record kept. Needs READ_RECORD and REMEMBER. Also the group commit's
# (store.group_writes).
PUT_DECISIONS = """
local function put_decisions(history, first_key, first_arg, ttl, cap)
  local out = {}
  for i = first_key, #KEYS do
    local key, a = KEYS[i], first_arg + 6 * (i - first_key)
    local found = read(key)
    if #found > 0 and not (found[1] == ARGV[a + 2] and (found[2] or '') == ARGV[a + 3]) then
      out[i - first_key + 1] = found
    else
      if #found > 0 then
        redis.call('DEL', key)
      end
      redis.call('HSET', key, 'decision', ARGV[a], 'fingerprint', ARGV[a + 1], 'published', '0')
      redis.call('PEXPIRE', key, ttl)
      remember(history, ARGV[a + 4], ARGV[a + 5], cap, ttl)
      out[i - first_key + 1] = {}
    end
  end
  return out
end
"""

# KEYS[1] the cluster's fence, KEYS[2] the cluster's history, KEYS[2 + i] decision i; ARGV[1]
# fencing token ('' for none), ARGV[2] ttl ms, ARGV[3] history cap, then six per decision from
# ARGV[4] (see put_decisions).
# Returns {-1, latest token} when fenced out (nothing written), else {0, put_decisions' reply}.
# Running it twice is harmless: the second run finds the first one's records.
PUT_MANY = (
    READ_RECORD
    + REMEMBER
    + PUT_DECISIONS
    + """
if ARGV[1] ~= '' then
  local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
  if fence ~= tonumber(ARGV[1]) then
    return {-1, fence}
  end
end
return {0, put_decisions(KEYS[2], 3, 4, ARGV[2], ARGV[3])}
"""
)

# KEYS decisions. Returns per decision 1 if this call marked it, 0 if it was marked already or is
# gone (or is a record of the older layout, published by definition).
MARK_MANY = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = 0
  if redis.call('TYPE', key)['ok'] == 'hash' and redis.call('HGET', key, 'published') ~= '1' then
    redis.call('HSET', key, 'published', '1')
    out[i] = 1
  end
end
return out
"""

# KEYS decisions; ARGV[1] the claim's lease, ms. Claims each decision not marked published whose
# claim (if any) has lapsed, until Redis time + lease. Returns per decision 1 if this call claimed it,
# 0 if it is marked published, claimed by another, gone, or a record of the older layout.
CLAIM_MANY = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = 0
  if redis.call('TYPE', key)['ok'] == 'hash' and redis.call('HGET', key, 'published') ~= '1'
      and tonumber(redis.call('HGET', key, 'claimed') or '0') < ms then
    redis.call('HSET', key, 'claimed', ms + tonumber(ARGV[1]))
    out[i] = 1
  end
end
return out
"""

# KEYS[1] the cluster's history; ARGV[1] how many, ARGV[2] the decision keys' prefix (the history
# names request ids: the keys are built here so the whole read is one script). Returns
# {request id, read(key)} per id, newest first; ids whose decision expired are dropped from the
# history on the way.
RECENT = (
    READ_RECORD
    + """
local ids = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local out = {}
for _, id in ipairs(ids) do
  local found = read(ARGV[2] .. id)
  if #found == 0 then
    redis.call('ZREM', KEYS[1], id)
  else
    out[#out + 1] = {id, found}
  end
end
return out
"""
)


__all__ = [
    "CLAIM_MANY",
    "GET_MANY",
    "MARK_MANY",
    "PUT",
    "PUT_DECISIONS",
    "PUT_MANY",
    "READ_RECORD",
    "RECENT",
    "REMEMBER",
]
