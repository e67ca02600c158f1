-- Shared by every script of the store, which runs it before its own body.
--
-- A value hash holds v (the value's bytes), ver (its version), exp (when the
-- value expires, ms since the epoch by the server's clock; absent: never),
-- the key's high-water mark: tok, hold (token and holder of the newest
-- admitted fence) and res (the resource that fence was for), and the retry
-- records of recent writes:
--
--   w:<id>  the reply of the write with that id: "<status> <version> <expiry>"
--   q:<n>   "<ms> <id>": the n-th record, made at that server time
--   qh, qt  the queue's head and tail: records q:<qh> .. q:<qt - 1> are live
--   qa      no later than the time of record q:<qh>: while qa + window is
--           still ahead, no record has expired and a write skips the scan
--
-- Every write carries an id unique to the call. A run that finds its id
-- recorded is a client retry of a run that already happened, and answers with
-- that run's reply, whatever happened to the key since. Records are kept for
-- the retry window (ms, an argument of each script): each recording run drops
-- up to max_drops records older than that, oldest first, so the cost stays
-- constant per write and the records held stay about the writes of the last
-- window.

local max_drops = 4

-- clock returns the server's time in ms since the epoch, read once per run.
local function clock(s)
  if not s.now then
    local t = redis.call('TIME')
    s.now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return s.now
end

-- read_value reads key's hash without writing; wid is the call's write id
-- ('' for a read), whose record it reads too. It returns the state, or nil
-- and the reply for a key this store cannot use (left as it is). The server
-- clock is read only when something needs it (see clock).
local function read_value(key, wid)
  local h
  if wid == '' then
    -- A read: the write records' fields are not needed.
    h = redis.pcall('HMGET', key, 'v', 'ver', 'tok', 'hold', 'res', 'exp')
  else
    h = redis.pcall('HMGET', key, 'v', 'ver', 'tok', 'hold', 'res', 'exp', 'qh', 'qt', 'qa', 'w:' .. wid)
  end
  local kind = 'hash'
  if h.err then
    kind = redis.call('TYPE', key)['ok']
  elseif not h[2] then
    -- No version: a missing key, or a hash this store did not write.
    kind = redis.call('TYPE', key)['ok']
  end
  if kind ~= 'none' and kind ~= 'hash' then
    return nil, {'WRONGTYPE', kind}
  end
  if kind == 'hash' and not h[2] then
    return nil, {'WRONGTYPE', 'hash without a version field'}
  end
  local s = {kind = kind, data = h[1], stored_ver = h[2], tok = h[3], hold = h[4], res = h[5],
             exp = h[6], qh = tonumber(h[7] or '0'), qt = tonumber(h[8] or '0'), qa = tonumber(h[9] or ''),
             ver = tonumber(h[2] or '0')}
  if wid ~= '' then
    s.record = h[10]
  end
  s.live = s.data and (not s.exp or tonumber(s.exp) > clock(s))
  if s.data and not s.live then
    -- An expired value counts as deleted at its expiry, so its version moves on.
    s.ver = s.ver + 1
  end
  return s
end

-- replay returns the reply recorded by the first run of a retried write.
local function replay(record)
  local status, ver, exp = string.match(record, '^(%u+) (%d+) (%d+)$')
  if status == 'OK' then
    return {'OK', tonumber(ver), false, tonumber(exp)}
  end
  return {status, tonumber(ver)}
end

-- record_fields drops records older than window ms (up to max_drops, oldest
-- first) and returns the fields that record reply as the outcome of the
-- write with id wid, for the caller's HSET. It runs after the checks.
local function record_fields(key, s, wid, window, reply)
  local now = clock(s)
  local head, tail, oldest = s.qh, s.qt, s.qa
  if head < tail and (not oldest or oldest + window <= now) then
    local drops = 0
    oldest = nil
    while head < tail and drops < max_drops do
      local entry = redis.call('HGET', key, 'q:' .. head)
      local at, id = string.match(entry or '', '^(%d+) (.*)$')
      if at and tonumber(at) + window > now then
        oldest = tonumber(at)
        break
      end
      if id then
        redis.call('HDEL', key, 'q:' .. head, 'w:' .. id)
      else
        redis.call('HDEL', key, 'q:' .. head)
      end
      head, drops = head + 1, drops + 1
      if at then
        oldest = tonumber(at) -- records are queued in time order
      end
    end
  end
  if head == tail then
    head, tail, oldest = 0, 0, now -- empty: restart the numbering
  end
  local fields = {'w:' .. wid, reply[1] .. ' ' .. reply[2] .. ' ' .. (reply[4] or 0),
                  'q:' .. tail, now .. ' ' .. wid, 'qh', head, 'qt', tail + 1}
  if oldest ~= s.qa then
    fields[#fields + 1] = 'qa'
    fields[#fields + 1] = oldest or 0
  end
  return fields
end

-- remember records reply as the outcome of the write with id wid (see
-- record_fields) and returns reply. It runs after the write.
local function remember(key, s, wid, window, reply)
  redis.call('HSET', key, unpack(record_fields(key, s, wid, window, reply)))
  return reply
end

-- keep_mark restarts the retention of a hash holding no live value, as
-- drop_value does, without changing anything else: a refused fence keeps the
-- mark that refused it alive.
local function keep_mark(key, s, retention)
  if retention > 0 and s.kind == 'hash' and not s.live then
    local ttl = redis.call('PTTL', key)
    if ttl >= 0 and ttl < retention then
      redis.call('PEXPIRE', key, retention)
    end
  end
end

-- write_value stores data as the value with the next version, living ttl ms
-- (0: no expiry), plus the field/value pairs in extra, and records the
-- write with id wid (see record_fields) in the same HSET. retention (ms, 0:
-- none) bounds how long the hash outlives an expiring value. Returns the
-- reply.
local function write_value(key, s, data, ttl, retention, extra, wid, window)
  local ver = s.ver + 1
  local exp = 0
  local fields = {'v', data, 'ver', ver}
  for _, x in ipairs(extra) do
    fields[#fields + 1] = x
  end
  if ttl > 0 then
    exp = clock(s) + ttl
    fields[#fields + 1] = 'exp'
    fields[#fields + 1] = exp
  end
  local reply = {'OK', ver, false, exp}
  for _, x in ipairs(record_fields(key, s, wid, window, reply)) do
    fields[#fields + 1] = x
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
  return reply
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
