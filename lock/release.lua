-- Delete the lock only if this grant still holds it and, in the same step,
-- hand it to the first live waiter in the resource's queue, or announce
-- that it is free. Runs after tokenstate.lua.
-- KEYS[1] lock key; then, all optional (with the same hash tag): KEYS[2]
-- token state, KEYS[3] hold record, KEYS[4] wait queue, KEYS[5] waiter
-- entries (see acquire.lua).
-- ARGV[1] holder id ('' with an acquisition id: the holder the hold record
-- names), ARGV[2] release channel (same hash tag), ARGV[3] '1' to publish
-- on the sharded channel (SPUBLISH, cluster), ARGV[4] acquisition id of an
-- owner's hold ('' for a lock without owner), ARGV[5] (optional) token
-- retention in ms: without it the lock is never handed over, ARGV[6]
-- (optional) '1' when a waiter gives up: its queue entry goes too.
-- Returns 1 if released, 0 if not held. With an acquisition id it releases
-- that one hold, and the lock only with the last one; a retried release
-- of a hold that is still counted elsewhere returns 1 again.
--
-- Hand-over: queue entries are taken first come, first served; one whose
-- waiter stopped refreshing it (life passed) is dropped. The lock is
-- granted to the first live one exactly as acquire.lua grants it (a new
-- token, the waiter's lease, its hold record), and "<holder> <token>
-- <refreshed µs> <age ms>" is published: the waiter takes the grant from
-- the message without another round trip. refreshed names the entry's last
-- refresh (acquire.lua returned it to the waiter) and age is how long
-- before the grant that was, rounded down, so the waiter can date its lease
-- no later than the grant. With no live waiter, an empty message says the lock is
-- free. Hand-over never fails the release: when the token state cannot be
-- read or the token space is spent, the lock is simply freed.
local function publish(msg)
  if ARGV[3] == '1' then
    redis.call('SPUBLISH', ARGV[2], msg)
  else
    redis.call('PUBLISH', ARGV[2], msg)
  end
end

local function not_held()
  if ARGV[6] == '1' and KEYS[5] then
    -- A waiter's queue id is its holder id, which is also its acquisition
    -- id when it names an owner.
    local me = ARGV[1]
    if me == '' then
      me = ARGV[4]
    end
    redis.pcall('HDEL', KEYS[5], me)
    redis.pcall('ZREM', KEYS[4], me)
  end
  return 0
end

-- hand_over grants the lock to the first live queued waiter, overwriting
-- the lock key, and reports whether it did.
local function hand_over()
  if not KEYS[5] or not ARGV[5] or ARGV[5] == '' then
    return false
  end
  local top = redis.pcall('ZPOPMIN', KEYS[4])
  if type(top) ~= 'table' or top.err or #top == 0 then
    return false
  end
  local n = read_state(KEYS[2], 'token state')
  local now = now_us()
  local token = n and next_token(n, now)
  if not token then
    redis.call('ZADD', KEYS[4], top[2], top[1])
    return false
  end
  while top and #top > 0 do
    local w = top[1]
    local e = redis.pcall('HGET', KEYS[5], w)
    redis.pcall('HDEL', KEYS[5], w)
    local ref, life, lease, owner
    if type(e) == 'string' then
      ref, life, lease, owner = string.match(e, '^(%d+) (%d+) (%d+) (.*)$')
    end
    local holdType = 'none'
    if owner and owner ~= '' then
      holdType = redis.call('TYPE', KEYS[3]).ok
    end
    -- A waiter past its entry's life, or one whose hold record was
    -- replaced by a value of another type, is passed over.
    if ref and tonumber(ref) + tonumber(life) * 1000 >= now and (holdType == 'none' or holdType == 'hash') then
      lease = tonumber(lease)
      redis.call('SET', KEYS[1], w, 'PX', lease)
      local ts = num(token)
      redis.call('SET', KEYS[2], state(token, token, mark(w), ts),
        'PX', keep_ms(token, now, lease, tonumber(ARGV[5])))
      if owner ~= '' then
        redis.call('DEL', KEYS[3])
        redis.call('HSET', KEYS[3], 'o', owner, 'h', w, 't', ts, 'n', 1, 'a:' .. w, '1')
        redis.call('PEXPIRE', KEYS[3], lease)
      end
      -- age is below the entry's life, so tostring writes it exactly; it is
      -- 0 when this server's clock is behind the one that wrote the entry
      -- (a failover), which still dates the lease no later than the grant.
      publish(w .. ' ' .. ts .. ' ' .. ref .. ' ' .. tostring(math.max(0, math.floor((now - tonumber(ref)) / 1000))))
      return true
    end
    top = redis.call('ZPOPMIN', KEYS[4])
  end
  return false
end

local holder = ARGV[1]
local acq = ARGV[4]
if acq ~= '' then
  local rec = redis.call('HMGET', KEYS[3], 'h', 'a:' .. acq)
  if holder == '' then
    holder = rec[1]
  end
  if not holder or redis.call('GET', KEYS[1]) ~= holder then
    return not_held()
  end
  if rec[1] == holder then
    if rec[2] == '0' then
      return 1
    end
    if rec[2] ~= '1' then
      return not_held()
    end
    if redis.call('HINCRBY', KEYS[3], 'n', -1) > 0 then
      redis.call('HSET', KEYS[3], 'a:' .. acq, '0')
      return 1
    end
  end
  redis.call('DEL', KEYS[3])
elseif redis.call('GET', KEYS[1]) ~= holder then
  return not_held()
end
if not hand_over() then
  redis.call('DEL', KEYS[1])
  publish('')
end
return 1
