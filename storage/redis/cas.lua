-- Version-checked write or delete of one value hash, needing no fence. It
-- neither checks nor changes the high-water mark.
--
-- KEYS[1]  the value hash
-- ARGV[1]  operation: "set" or "del"
-- ARGV[2]  expected version
-- ARGV[3]  value bytes (set only)
-- ARGV[4]  value lifetime in milliseconds, 0 for none (set only)
-- ARGV[5]  retention in milliseconds of a key holding no live value, 0 to keep it forever
--
-- Every check comes before the first write, so a refused call changes nothing.
-- Replies: {"OK", version, false, expiresAtMs}, {"CONFLICT", version}, {"WRONGTYPE", type}.

local key = KEYS[1]
local op = ARGV[1]

local kind = redis.call('TYPE', key)['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return {'WRONGTYPE', kind}
end
local h = redis.call('HMGET', key, 'v', 'ver', 'exp')
if kind == 'hash' and not h[2] then
  return {'WRONGTYPE', 'hash without a version field'}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ver = tonumber(h[2] or '0')
local live = h[1] and (not h[3] or tonumber(h[3]) > now)
if h[1] and not live then
  -- An expired value counts as deleted at its expiry, so its version moves on.
  ver = ver + 1
end
if tonumber(ARGV[2]) ~= ver then
  return {'CONFLICT', ver}
end

-- Checks are done; writes start here.
local retention = tonumber(ARGV[5])

if op == 'set' then
  ver = ver + 1
  local ttl = tonumber(ARGV[4])
  local exp = 0
  redis.call('HSET', key, 'v', ARGV[3], 'ver', ver)
  if ttl > 0 then
    exp = now + ttl
    redis.call('HSET', key, 'exp', exp)
  elseif h[3] then
    redis.call('HDEL', key, 'exp')
  end
  if ttl > 0 and retention > 0 then
    redis.call('PEXPIREAT', key, exp + retention)
  else
    redis.call('PERSIST', key)
  end
  return {'OK', ver, false, exp}
end

-- del: a missing value stays missing and keeps its version.
if live then
  ver = ver + 1
end
if kind == 'none' then
  return {'OK', ver, false, 0}
end
redis.call('HSET', key, 'ver', ver)
if h[1] then
  redis.call('HDEL', key, 'v', 'exp')
end
-- No live value is left: the hash lives at least retention from now.
if retention > 0 and redis.call('PTTL', key) < retention then
  redis.call('PEXPIRE', key, retention)
end
return {'OK', ver, false, 0}
