"""The Lua scripts of the shared store: each operation on leases, membership and rates is one
atomic script on the Redis (or Valkey) server, so replicas never race between a check and a
write.

Every script takes the time as its ``ARGV[1]``: an integer of milliseconds, or an empty string
for the server's own clock (``TIME``, read inside the script, so every replica uses the same
one). A lease (or a member) is live while its score, its expiry in milliseconds, is above now;
each script first drops the expired members of the sets it reads.

A lease's keys are passed in ``KEYS`` (its provider's general set, its long-context set when it
holds one or always in ``acquire`` and ``release``, its principal's set when it has a
principal), so the scripts touch only declared keys.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ACQUIRE", "HEARTBEAT", "REASSERT", "RELEASE", "RENEW", "TAKE_RATE", "VIEW"]

#: now in ms: the ARGV[1] a test gave, else the server's clock
_NOW: Final = """
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function live(key)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end
-- the next version of the counts: a counter that starts, when the store has none (a new or
-- restarted store), at the server's clock in microseconds, so that it never goes back
local function next_version(key)
  if redis.call('EXISTS', key) == 0 then
    local t = redis.call('TIME')
    local base = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', key, string.format('%d', base))
  end
  return redis.call('INCR', key)
end
-- the members of one instance in a set (its lease ids start with "instance:")
local function held_by(key, instance)
  local prefix = instance .. ':'
  local n = 0
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if string.sub(member, 1, #prefix) == prefix then n = n + 1 end
  end
  return n
end
"""

ACQUIRE: Final = (
    _NOW
    + """
-- KEYS: general, long[, principal]
-- ARGV: now, lease id, ttl ms, capacity, long ('1'|'0'), long capacity, principal cap ('' none),
-- the version counter's key
local id = ARGV[2]
local expiry = now + tonumber(ARGV[3])
local is_long = ARGV[5] == '1'
local has_principal = #KEYS >= 3
local held = live(KEYS[1])
local long_held = live(KEYS[2])
local principal_held = 0
if has_principal then principal_held = live(KEYS[3]) end
-- the count of the others: a lease acquired again does not count against itself
local function others(key, count)
  if redis.call('ZSCORE', key, id) then return count - 1 end
  return count
end
local refused = ''
if others(KEYS[1], held) >= tonumber(ARGV[4]) then
  refused = 'provider'
elseif is_long and others(KEYS[2], long_held) >= tonumber(ARGV[6]) then
  refused = 'long'
elseif ARGV[7] ~= '' and others(KEYS[3], principal_held) >= tonumber(ARGV[7]) then
  refused = 'principal'
end
if refused == '' then
  held = held + redis.call('ZADD', KEYS[1], expiry, id)
  if is_long then long_held = long_held + redis.call('ZADD', KEYS[2], expiry, id) end
  if has_principal then
    principal_held = principal_held + redis.call('ZADD', KEYS[3], expiry, id)
  end
end
-- the version orders every answer about these counts; the caller's own leases in each set
local instance = string.match(id, '^[^:]*')
local mine = {held_by(KEYS[1], instance), held_by(KEYS[2], instance), 0}
if has_principal then mine[3] = held_by(KEYS[3], instance) end
local version = next_version(ARGV[8])
return {refused, held, long_held, principal_held, version, mine[1], mine[2], mine[3]}
"""
)

RELEASE: Final = (
    _NOW
    + """
-- KEYS: general, long[, principal]
-- ARGV: now, lease id, channel, provider, principal ('' none), instance, the version's key
local id = ARGV[2]
local changed = 0
local function drop(key)
  changed = changed + redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  changed = changed + redis.call('ZREM', key, id)
  return redis.call('ZCARD', key)
end
local held = drop(KEYS[1])
local long_held = drop(KEYS[2])
local principal_held = 0
if #KEYS >= 3 then principal_held = drop(KEYS[3]) end
-- a release that changed nothing (already released, or expired and dropped before) tells
-- nobody: no slot was freed by it
local version = next_version(ARGV[7])
-- (the version as a string: cjson writes a number with 14 digits, and a version has 16)
if changed > 0 then
  redis.call('PUBLISH', ARGV[3], cjson.encode(
    {ARGV[4], held, long_held, ARGV[5], principal_held, ARGV[6], string.format('%d', version)}))
end
local mine = {held_by(KEYS[1], ARGV[6]), held_by(KEYS[2], ARGV[6]), 0}
if #KEYS >= 3 then mine[3] = held_by(KEYS[3], ARGV[6]) end
return {held, long_held, principal_held, version, mine[1], mine[2], mine[3]}
"""
)

RENEW: Final = (
    _NOW
    + """
-- ARGV: now, ttl ms, then per lease: its id, how many of KEYS are its (general first)
-- KEYS: each lease's keys in turn
local expiry = now + tonumber(ARGV[2])
local missing = {}
local k = 1
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  local score = redis.call('ZSCORE', KEYS[k], id)
  if score and tonumber(score) > now then
    for j = k, k + n - 1 do redis.call('ZADD', KEYS[j], 'XX', expiry, id) end
  else
    -- gone from its general set (expired, or taken away): its holder stops, so it must not
    -- keep counting anywhere else either
    for j = k, k + n - 1 do redis.call('ZREM', KEYS[j], id) end
    missing[#missing + 1] = id
  end
  k = k + n
end
return missing
"""
)

REASSERT: Final = (
    _NOW
    + """
-- the layout of RENEW; every lease is added (or refreshed) in all its keys, unchecked
local expiry = now + tonumber(ARGV[2])
local k = 1
for i = 3, #ARGV, 2 do
  local n = tonumber(ARGV[i + 1])
  for j = k, k + n - 1 do redis.call('ZADD', KEYS[j], expiry, ARGV[i]) end
  k = k + n
end
return 0
"""
)

HEARTBEAT: Final = (
    _NOW
    + """
-- KEYS: members; ARGV: now, instance id, ttl ms
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
return live(KEYS[1])
"""
)

VIEW: Final = (
    _NOW
    + """
-- KEYS: members, then general and long of each provider, then each principal's
-- ARGV: now, number of providers, the version's key, the caller's instance
-- returns: members, version, {held, long held, {instance, count, ...}, the caller's long}
-- per provider, {count, the caller's} per principal
local providers = tonumber(ARGV[2])
local found = {live(KEYS[1]), next_version(ARGV[3])}
for i = 1, providers do
  local general = KEYS[2 * i]
  local held = live(general)
  local counts = {}
  local order = {}
  for _, member in ipairs(redis.call('ZRANGE', general, 0, -1)) do
    local instance = string.match(member, '^[^:]*')
    if not counts[instance] then
      counts[instance] = 0
      order[#order + 1] = instance
    end
    counts[instance] = counts[instance] + 1
  end
  local by = {}
  for _, instance in ipairs(order) do
    by[#by + 1] = instance
    by[#by + 1] = counts[instance]
  end
  local long = KEYS[2 * i + 1]
  found[#found + 1] = {held, live(long), by, held_by(long, ARGV[4])}
end
local principals = {}
for j = 2 * providers + 2, #KEYS do
  principals[#principals + 1] = {live(KEYS[j]), held_by(KEYS[j], ARGV[4])}
end
found[#found + 1] = principals
return found
"""
)

TAKE_RATE: Final = """
-- KEYS: the principal's bucket (a hash: tokens, at); ARGV: now ('' server), per minute
-- The arithmetic of iop_edge/pool/rates.py in seconds as doubles, step for step, so a bucket
-- here and one there give the same answers at the same times.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local limit = tonumber(ARGV[2])
local rate = limit / 60.0
local now_s = now / 1000.0
local tokens = limit
local at_s = now_s
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
if state[1] and state[2] then
  tokens = tonumber(state[1])
  at_s = tonumber(state[2]) / 1000.0
end
tokens = math.min(limit, tokens + (now_s - at_s) * rate)
local wait = ''
if tokens >= 1.0 then
  tokens = tokens - 1.0
else
  wait = string.format('%.17g', (1.0 - tokens) / rate)
end
-- '%.17g': a double written so that it reads back the same (tostring keeps 14 digits)
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
  'at', string.format('%.17g', now))
-- an idle bucket vanishes once it would be full again (a missing bucket is a full one)
redis.call('PEXPIRE', KEYS[1], math.ceil((limit - tokens) / rate * 1000) + 1000)
return wait
"""
