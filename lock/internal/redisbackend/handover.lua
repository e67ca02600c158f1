-- Shared by the scripts that hand the lock to a queued waiter (release, and
-- a queueing acquire that finds the lock free with others ahead of it),
-- which run it after tokenstate.lua and before their body. KEYS are those
-- of acquire.lua: lock, token state, hold record, wait queue, waiter
-- entries.

-- publish announces msg on channel, sharded ('1': SPUBLISH) on a cluster.
local function publish(channel, sharded, msg)
  if sharded == '1' then
    redis.call('SPUBLISH', channel, msg)
  else
    redis.call('PUBLISH', channel, msg)
  end
end

-- announce_queue tells the first waiters of the queue where they stand,
-- after a script changed who is first (a grant to a waiter, a waiter that
-- took the lock or left):
-- "q:<remaining ms>:<first>[:<second>[:<third>]]: 1 0 0", the remaining
-- time being the lock's PTTL (-2: free, -1: no expiry). The first tries
-- when that runs out, the others a little later each, so a waiter that
-- vanished ahead of them costs them no more than the lease it was given
-- (see wait.go). Nothing is published with nobody queued.
-- The tail " 1 0 0" gives the message a grant's four words, so a reader
-- that knows only grants (the releases before announcements, which read
-- any other message as "the lock is free" and woke a waiter) takes it for
-- a grant to a holder it does not have, and ignores it; the ':' before it
-- keeps the names whole for the release that read announcements without
-- it, but for the third, which that one reads with the tail.
local function announce_queue(channel, sharded)
  local first = redis.pcall('ZRANGE', KEYS[4], 0, 2)
  if type(first) ~= 'table' or first.err or #first == 0 then
    return
  end
  publish(channel, sharded, 'q:' .. redis.call('PTTL', KEYS[1]) .. ':' .. table.concat(first, ':') .. ': 1 0 0')
end

-- hand_over grants the lock to the first live queued waiter, overwriting
-- the lock key, announces the grant on channel, and reports whether it
-- did. Entries are taken first come, first served; one whose waiter
-- stopped refreshing it (life passed) is dropped. The grant is made exactly
-- as acquire.lua makes one (a new token, the waiter's lease, its hold
-- record) and "<holder> <token> <refreshed µs> <age ms>" is published: the
-- waiter takes the grant from the message without another round trip; the
-- waiters now first are then told so (announce_queue) when the new lease is
-- shorter than a queue refresh.
-- refreshed names the entry's last refresh (acquire.lua returned it to the
-- waiter) and age is how long before the grant that was, rounded down, so
-- the waiter can date its lease no later than the grant. When the token
-- state cannot be read or the token space is spent, nothing is granted.
-- The second result says whether anyone was queued, live or not.
local function hand_over(channel, sharded, retention)
  local top = redis.pcall('ZPOPMIN', KEYS[4])
  if type(top) ~= 'table' or top.err or #top == 0 then
    return false, false
  end
  local n = read_state(KEYS[2], 'token state')
  local now = now_us()
  local token = n and next_token(n, now)
  if not token then
    redis.call('ZADD', KEYS[4], top[2], top[1])
    return false, true
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
        'PX', keep_ms(token, now, lease, retention))
      if owner ~= '' then
        redis.call('DEL', KEYS[3])
        redis.call('HSET', KEYS[3], 'o', owner, 'h', w, 't', ts, 'n', 1, 'a:' .. w, '1')
        redis.call('PEXPIRE', KEYS[3], lease)
      end
      -- age is below the entry's life, so tostring writes it exactly; it is
      -- 0 when this server's clock is behind the one that wrote the entry
      -- (a failover), which still dates the lease no later than the grant.
      publish(channel, sharded, w .. ' ' .. ts .. ' ' .. ref .. ' ' .. tostring(math.max(0, math.floor((now - tonumber(ref)) / 1000))))
      -- The waiters now first are told where they stand only when the new
      -- lease is shorter than a queue refresh (1000 ms, the client's
      -- QueueRefresh): each waiter refreshes its entry within that time and
      -- the refresh's reply tells it the same, before a longer lease can
      -- end, so the announcement would move no try and would only delay
      -- this script's reply and the grant's delivery, which Redis sends
      -- once the script is done.
      if lease < 1000 then
        announce_queue(channel, sharded)
      end
      return true
    end
    top = redis.call('ZPOPMIN', KEYS[4])
  end
  return false, true
end
