-- Shared by every script of the store, which runs it before its own body.
--
-- A value hash holds v (the value's bytes), ver (its version), exp (when the
-- value expires, ms since the epoch by the server's clock; absent: never),
-- the key's high-water mark: tok, hold (token and holder of the newest
-- admitted fence) and res (the resource that fence was for), and wid (the id
-- of the last version-checked write).

-- read_value reads key's hash without writing. It returns the state, or nil
-- and the reply for a key this store cannot use (left as it is).
local function read_value(key)
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= 'hash' then
    return nil, {'WRONGTYPE', kind}
  end
  local h = redis.call('HMGET', key, 'v', 'ver', 'tok', 'hold', 'res', 'exp', 'wid')
  if kind == 'hash' and not h[2] then
    return nil, {'WRONGTYPE', 'hash without a version field'}
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local s = {kind = kind, data = h[1], stored_ver = h[2], tok = h[3], hold = h[4], res = h[5],
             exp = h[6], wid = h[7], now = now, ver = tonumber(h[2] or '0')}
  s.live = s.data and (not s.exp or tonumber(s.exp) > now)
  if s.data and not s.live then
    -- An expired value counts as deleted at its expiry, so its version moves on.
    s.ver = s.ver + 1
  end
  return s
end

-- replayed reports whether the version-checked write with id wid has
-- already been made: a client retried it after losing the first run's reply.
-- Its result is then the version it wrote, expected + 1, not a conflict.
local function replayed(s, wid, expected)
  return wid ~= '' and s.wid == wid and s.ver >= expected + 1
end

-- replay_reply is the reply of a write found by replayed.
local function replay_reply(s, expected)
  local exp = 0
  if s.ver == expected + 1 then
    exp = tonumber(s.exp or '0')
  end
  return {'OK', expected + 1, false, exp}
end

-- write_value stores data as the value with the next version, living ttl ms
-- (0: no expiry), plus the field/value pairs in extra. retention (ms, 0:
-- none) bounds how long the hash outlives an expiring value. Returns the
-- reply.
local function write_value(key, s, data, ttl, retention, extra)
  local ver = s.ver + 1
  local exp = 0
  redis.call('HSET', key, 'v', data, 'ver', ver, unpack(extra))
  if ttl > 0 then
    exp = s.now + ttl
    redis.call('HSET', key, 'exp', exp)
  elseif s.exp then
    redis.call('HDEL', key, 'exp')
  end
  if ttl > 0 and retention > 0 then
    redis.call('PEXPIREAT', key, exp + retention)
  else
    redis.call('PERSIST', key)
  end
  return {'OK', ver, false, exp}
end

-- drop_value removes the value's bytes (keeping version and mark); the hash,
-- holding no live value, then lives at least retention ms from now.
local function drop_value(key, s, retention)
  if s.data then
    redis.call('HDEL', key, 'v', 'exp')
  end
  if retention > 0 and redis.call('PTTL', key) < retention then
    redis.call('PEXPIRE', key, retention)
  end
end
