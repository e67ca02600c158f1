-- Shared by every script of the store, which runs it before its own body.
--
-- A value hash holds v (the value's bytes), ver (its version), exp (when the
-- value expires, ms since the epoch by the server's clock; absent: never),
-- the key's high-water mark: tok, hold (token and holder of the newest
-- admitted fence) and res (the resource that fence was for), and rt: how
-- long (ms) the hash must outlive its last live value, the longest mark
-- retention of the stores that wrote it; absent: for ever. A store that
-- keeps marks for ever removes rt; a store with a retention sets it on a hash
-- it creates and raises it on one that has it, never lowers it and never
-- adds it to a hash kept for ever. So a store with a shorter retention never
-- lets Redis collect a mark that another store keeps longer.
--
-- Retry records live outside the hash: every call that may change something
-- names a key of its own in the hash's slot (KEYS[2]), and a run that changes
-- something stores its reply there, "<status> <version> <expiry>", for the
-- calling store's retry window (PX). A run that finds its record is a client
-- retry of a run that already happened and answers from it. Each record goes
-- by itself at the end of its own window, whether or not the value is
-- written again, and no key grows with the write rate.

-- clock returns the server's time in ms since the epoch, read once per run.
local function clock(s)
  if not s.now then
    local t = redis.call('TIME')
    s.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return s.now
end

-- is_count reports whether x is a count as this store writes one (a
-- version, an expiry time, a retention): decimal digits without a leading
-- zero, short enough to be exact as a Lua number.
local function is_count(x)
  return x == '0' or (#x <= 15 and string.find(x, '^[1-9]%d*$') ~= nil)
end

-- is_token reports whether x is a fence token as this store writes one: a
-- positive int64 in decimal, without a leading zero.
local function is_token(x)
  return string.find(x, '^[1-9]%d*$') ~= nil and (#x < 19 or (#x == 19 and x <= '9223372036854775807'))
end

-- is_ours reports whether the hash whose fields read_value read into h, of
-- n fields in all, has exactly the shape this store writes: ver always; v
-- or not, exp only with v; tok, hold and res all three or none; rt or not;
-- no other field; and every value of the form this store gives it. A hash
-- of another shape is not this store's to read or write.
local function is_ours(h, n)
  local v, ver, tok, hold, res, exp, rt = h[1], h[2], h[3], h[4], h[5], h[6], h[7]
  if not ver or not is_count(ver) then
    return false
  end
  local fields = 1
  if v then
    fields = fields + 1
  end
  if exp then
    if not v or not is_count(exp) then
      return false
    end
    fields = fields + 1
  end
  if tok or hold or res then
    if not (tok and hold and res) or hold == '' or res == '' or not is_token(tok) then
      return false
    end
    fields = fields + 3
  end
  if rt then
    if rt == '0' or not is_count(rt) then
      return false
    end
    fields = fields + 1
  end
  return fields == n
end

-- read_value reads key's hash without writing. It returns the state, or nil
-- and the reply for a key this store cannot use (left as it is): another
-- type, or a hash of a shape this store does not write (see is_ours). The
-- server clock is read only when something needs it (see clock).
local function read_value(key)
  local h = redis.pcall('HMGET', key, 'v', 'ver', 'tok', 'hold', 'res', 'exp', 'rt')
  if h.err then
    return nil, {'WRONGTYPE', redis.call('TYPE', key)['ok']}
  end
  -- HMGET answered, so the key is a hash or missing; Redis keeps no empty hash.
  local n = redis.call('HLEN', key)
  local kind = 'none'
  if n > 0 then
    if not is_ours(h, n) then
      return nil, {'WRONGTYPE', 'hash that this store did not write'}
    end
    kind = 'hash'
  end
  local s = {kind = kind, data = h[1], stored_ver = h[2], tok = h[3], hold = h[4], res = h[5],
             exp = h[6], rt = h[7], ver = tonumber(h[2] or '0')}
  s.live = s.data and (not s.exp or tonumber(s.exp) > clock(s))
  if s.data and not s.live then
    -- An expired value counts as deleted at its expiry, so its version moves on.
    s.ver = s.ver + 1
  end
  return s
end

-- parse splits a record into its status, version and expiry.
local function parse(record)
  local status, ver, exp = string.match(record, '^(%u+) (%d+) (%d+)$')
  return status, tonumber(ver), tonumber(exp)
end

-- replay returns the reply recorded by the first run of a retried write.
local function replay(record)
  local status, ver, exp = parse(record)
  if status == 'OK' then
    return {'OK', ver, false, exp}
  end
  return {status, ver}
end

-- remember records reply as the outcome of this call in rkey for window ms
-- (a number, or its decimal text) and returns reply. It runs after the
-- call's writes.
local function remember(rkey, window, reply)
  local exp = reply[4]
  if not exp or exp == 0 then
    exp = '0'
  end
  redis.call('SET', rkey, reply[1] .. ' ' .. reply[2] .. ' ' .. exp, 'PX', window)
  return reply
end

-- hold_for returns how long (ms) the hash must outlive its last live value
-- once a store with mark retention own (ms, 0: for ever) has written it.
local function hold_for(s, own)
  if s.kind == 'none' then
    return own
  end
  local rt = tonumber(s.rt or '0')
  if rt == 0 or own == 0 then
    return 0
  end
  return math.max(rt, own)
end

-- claim records hold (see hold_for) in the hash; a hash kept for ever loses
-- any TTL a store with a retention gave it. It runs with the call's writes.
local function claim(key, s, hold)
  if hold == tonumber(s.rt or '0') then
    return
  end
  if hold == 0 then
    redis.call('HDEL', key, 'rt')
    redis.call('PERSIST', key)
    s.rt = nil
  else
    redis.call('HSET', key, 'rt', hold)
    s.rt = tostring(hold)
  end
end

-- keep_mark restarts the retention of a hash holding no live value, as
-- drop_value does, without changing anything else: a refused fence keeps the
-- mark that refused it alive.
local function keep_mark(key, s, retention)
  retention = hold_for(s, retention)
  if retention > 0 and s.kind == 'hash' and not s.live then
    local ttl = redis.call('PTTL', key)
    if ttl >= 0 and ttl < retention then
      redis.call('PEXPIRE', key, retention)
    end
  end
end

-- write_value stores data as the value with the next version, living ttl ms
-- (0: no expiry), plus the field/value pairs in extra. retention (the
-- store's, ms, 0: none; see hold_for) bounds how long the hash outlives an
-- expiring value. Returns the reply.
local function write_value(key, s, data, ttl, retention, extra)
  retention = hold_for(s, retention)
  local ver = s.ver + 1
  local exp = 0
  -- One conversion of the version to text, rather than one by Redis.
  local fields = {'v', data, 'ver', tostring(ver)}
  for _, x in ipairs(extra) do
    fields[#fields + 1] = x
  end
  if ttl > 0 then
    exp = clock(s) + ttl
    fields[#fields + 1] = 'exp'
    fields[#fields + 1] = exp
  end
  redis.call('HSET', key, unpack(fields))
  if ttl <= 0 and s.exp then
    redis.call('HDEL', key, 'exp')
  end
  if ttl > 0 and retention > 0 then
    redis.call('PEXPIREAT', key, exp + retention)
  elseif not s.live or s.exp then
    -- A live value without expiry was written by this function with none,
    -- and only a missing or expiring value gives the hash a TTL: only then
    -- can there be one to remove.
    redis.call('PERSIST', key)
  end
  claim(key, s, retention)
  return {'OK', ver, false, exp}
end

-- drop_value removes the value's bytes (keeping version and mark); the hash,
-- holding no live value, then lives at least as long as the longest
-- retention of the stores that wrote it (see hold_for) from now.
local function drop_value(key, s, retention)
  retention = hold_for(s, retention)
  if s.data then
    redis.call('HDEL', key, 'v', 'exp')
  end
  if retention > 0 and redis.call('PTTL', key) < retention then
    redis.call('PEXPIRE', key, retention)
  end
  claim(key, s, retention)
end
