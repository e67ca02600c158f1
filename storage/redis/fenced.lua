-- Fenced read, write or delete of one value hash, admitted by the fence rule.
--
-- KEYS[1]  the value hash
-- ARGV[1]  operation: "get", "set" or "del"
-- ARGV[2]  fence resource
-- ARGV[3]  fence token (decimal, no leading zeros)
-- ARGV[4]  fence holder
-- ARGV[5]  value bytes (set only)
-- ARGV[6]  value lifetime in milliseconds, 0 for none (set only)
-- ARGV[7]  expected version, "" for no version check
-- ARGV[8]  retention in milliseconds of a key holding no live value, 0 to keep it forever
--
-- Every check comes before the first write, so a refused call changes nothing.
-- Replies: {"OK", version, data|false, expiresAtMs} for a live value,
--          {"NOTFOUND", version} when no live value is left or found,
--          {"STALE", resource, token, holder}, {"RESOURCE", resource},
--          {"CONFLICT", version}, {"WRONGTYPE", type}.

local key = KEYS[1]
local op, res, tok, hold = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local kind = redis.call('TYPE', key)['ok']
if kind ~= 'none' and kind ~= 'hash' then
  return {'WRONGTYPE', kind}
end
-- v: value, ver: version, tok/hold: high-water mark, res: resource, exp: expiry (ms)
local h = redis.call('HMGET', key, 'v', 'ver', 'tok', 'hold', 'res', 'exp')
if kind == 'hash' and not h[2] then
  return {'WRONGTYPE', 'hash without a version field'}
end
if h[5] and h[5] ~= res then
  return {'RESOURCE', h[5]}
end

-- Tokens are compared as decimal strings so that every int64 compares exactly.
local function cmp(a, b)
  if #a ~= #b then
    return #a < #b and -1 or 1
  end
  if a == b then
    return 0
  end
  return a < b and -1 or 1
end

if h[3] then
  local c = cmp(tok, h[3])
  if c < 0 or (c == 0 and hold ~= h[4]) then
    return {'STALE', h[5] or res, h[3], h[4] or ''}
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ver = tonumber(h[2] or '0')
local live = h[1] and (not h[6] or tonumber(h[6]) > now)
local expired = h[1] and not live
if expired then
  -- An expired value counts as deleted at its expiry, so its version moves on.
  ver = ver + 1
end
if ARGV[7] ~= '' and tonumber(ARGV[7]) ~= ver then
  return {'CONFLICT', ver}
end

-- Checks are done; writes start here.
local retention = tonumber(ARGV[8])

if op == 'set' then
  ver = ver + 1
  local ttl = tonumber(ARGV[6])
  local exp = 0
  redis.call('HSET', key, 'v', ARGV[5], 'ver', ver, 'tok', tok, 'hold', hold, 'res', res)
  if ttl > 0 then
    exp = now + ttl
    redis.call('HSET', key, 'exp', exp)
  elseif h[6] then
    redis.call('HDEL', key, 'exp')
  end
  if ttl > 0 and retention > 0 then
    redis.call('PEXPIREAT', key, exp + retention)
  else
    redis.call('PERSIST', key)
  end
  return {'OK', ver, false, exp}
end

if op == 'del' and live then
  ver = ver + 1
end
if h[3] ~= tok or h[4] ~= hold or h[5] ~= res or h[2] ~= tostring(ver) then
  redis.call('HSET', key, 'ver', ver, 'tok', tok, 'hold', hold, 'res', res)
end
if live and op == 'get' then
  return {'OK', ver, h[1], tonumber(h[6] or '0')}
end
if h[1] then
  redis.call('HDEL', key, 'v', 'exp')
end
-- No live value is left: the hash lives at least retention from now.
if retention > 0 and redis.call('PTTL', key) < retention then
  redis.call('PEXPIRE', key, retention)
end
return {'NOTFOUND', ver}
