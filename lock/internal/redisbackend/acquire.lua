-- Grant the lock and issue its fencing token in one step. Runs after
-- tokenstate.lua and handover.lua.
-- KEYS[1] lock key, KEYS[2] token state, KEYS[3] hold record (with an
-- owner or a queue), KEYS[4] wait queue and KEYS[5] waiter entries (only
-- with a queue); all with the same hash tag, so in the same slot.
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] token retention in ms,
-- ARGV[4] owner id ('' for none), ARGV[5] (optional) how long in ms a queue
-- entry lives without being refreshed ('' for a caller that does not queue):
-- a caller that will wait gives it, and a refused call then queues (or
-- refreshes) this holder for a grant by the release (see release.lua);
-- ARGV[6] and ARGV[7] (optional, with the queue keys) the release channel
-- and '1' to publish on it sharded: a caller that gives them respects the
-- queue (see below), whether or not it joins it.
-- Returns {1, token} when granted ({1, token, 1} when no token state was
-- found, so the token came from the clock), {0, remaining ms of the current holder}
-- when not (-1: the current holder set no expiry; a queued caller gets
-- {0, remaining ms, refreshed µs, place}, naming its entry and its place in
-- the queue, 0 for the head), {1, 0} for a grant of
-- this holder whose token state was lost (the caller releases it),
-- {2, token, holder} when the owner re-enters the lock it holds, and, for
-- a queued caller, {3, token, remaining ms} when the lock was already
-- handed to it from the queue. Every grant and re-entry takes the caller's
-- own queue entry out, so no release hands the lock to a waiter that
-- already has it, and a caller that was among the first three waiters
-- tells the waiters now first where they stand (announce_queue).
--
-- The queue is a sorted set of holder ids, scored by the server clock (µs)
-- of their first entry, so it is first come, first served; each holder's
-- entry "<refreshed µs> <life ms> <lease ms> <owner>" is in the waiter
-- entries hash. A refresh keeps the holder's place. Both keys outlive
-- their longest-lived entry, by at most one more life. A caller that
-- respects the queue and finds the lock free (its holder vanished) with
-- live waiters queued ahead of it does not take it: the lock goes to the
-- first of them, as a release would hand it over, and the caller is
-- refused (a queued caller stays queued), so the order holds after a lost
-- lease too, whoever tries first.
--
-- With an owner, the hold record (a hash) names the owner (o), the grant's
-- holder (h) and token (t), the number of holds (n), and each acquisition
-- as a:<id> ('1' held, '0' released), where id is this call's ARGV[1]. A
-- re-entry adds a hold and extends the lock to at least its own lease; a
-- retried re-entry finds its own a:<id> and adds nothing.
-- The token is max(n + 1, server clock in µs): above every earlier token
-- while the state lives, and above every earlier token once it has expired
-- or was lost, as long as the clock has not gone back past them.
-- A second run for the same holder id (a client retrying after a lost reply)
-- finds its own grant and returns it again instead of a refusal.
-- Every check comes before the first write: a refused call changes nothing
-- but its own queue entry (and, when it found the lock free, the hand-over
-- to the waiter queued ahead of it).
-- A refused call reads neither the token state nor the clock's token, so a
-- wrong-typed token state is reported by the call that would grant.

-- queue_error is the reply for a queue write that failed with err: a
-- wrong-typed key, named by what, or whatever else the server said (an ACL
-- that refuses the command, say), with the key it was writing.
local function queue_error(err, what, key)
  if string.sub(err, 1, 9) == 'WRONGTYPE' then
    return redis.error_reply('WRONGTYPE ' .. what .. ': ' .. err)
  end
  return redis.error_reply(err .. ' (joining the wait queue: writing ' .. key .. ')')
end

local owner = ARGV[4]
local life = ARGV[5] and ARGV[5] ~= '' and tonumber(ARGV[5])
local ordered = ARGV[6] ~= nil

-- dequeue takes this holder's own entry out of the queue, if it has one,
-- and tells the waiters now first when it was among them.
local function dequeue()
  if ordered then
    redis.pcall('HDEL', KEYS[5], ARGV[1])
    local rank = redis.pcall('ZRANK', KEYS[4], ARGV[1])
    if type(rank) == 'number' then
      redis.pcall('ZREM', KEYS[4], ARGV[1])
      if rank <= 2 then
        announce_queue(ARGV[6], ARGV[7])
      end
    end
  end
end
if owner ~= '' then
  local holdType = redis.call('TYPE', KEYS[3]).ok
  if holdType ~= 'none' and holdType ~= 'hash' then
    return redis.error_reply('WRONGTYPE hold record ' .. KEYS[3] .. ' holds a ' .. holdType .. ', not a hash')
  end
end
local lease = tonumber(ARGV[2])

-- enqueue queues this holder, or refreshes its entry and keeps its place,
-- and returns the refusal a queued caller gets. The entry is written first
-- and undone if the queue cannot take it, so a wrong-typed key changes
-- nothing.
local function enqueue()
  local t = redis.call('TIME')
  local now = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  local r = redis.pcall('HSET', KEYS[5], ARGV[1], now .. ' ' .. ARGV[5] .. ' ' .. ARGV[2] .. ' ' .. owner)
  if type(r) == 'table' and r.err then
    return queue_error(r.err, 'waiter entries ' .. KEYS[5] .. ' are not a hash', KEYS[5])
  end
  r = redis.pcall('ZADD', KEYS[4], 'NX', now, ARGV[1])
  if type(r) == 'table' and r.err then
    redis.pcall('HDEL', KEYS[5], ARGV[1])
    return queue_error(r.err, 'wait queue ' .. KEYS[4] .. ' is not a sorted set', KEYS[4])
  end
  if redis.call('PTTL', KEYS[5]) < life then
    -- Twice the life, so that only one refresh in many pays for this.
    redis.call('PEXPIRE', KEYS[5], 2 * life)
    redis.call('PEXPIRE', KEYS[4], 2 * life)
  end
  return {0, redis.call('PTTL', KEYS[1]), tonumber(now), redis.call('ZRANK', KEYS[4], ARGV[1])}
end

local cur = redis.pcall('GET', KEYS[1])
if type(cur) == 'table' and cur.err then
  return redis.error_reply('WRONGTYPE lock key ' .. KEYS[1] .. ' is not a string: ' .. cur.err)
end
if cur then
  -- Held: no token is needed, so the token state is not read.
  if cur == ARGV[1] then
    local n, g, h = read_state(KEYS[2], 'token state')
    if not n then
      return g
    end
    if h ~= mark(ARGV[1]) then
      return {1, 0}
    end
    if life then
      return {3, g, redis.call('PTTL', KEYS[1])}
    end
    return {1, g}
  end
  if owner ~= '' then
    local rec = redis.call('HMGET', KEYS[3], 'o', 'h', 't', 'a:' .. ARGV[1])
    if rec[1] == owner and rec[2] == cur then
      -- Re-entered: this holder waits no more.
      dequeue()
      if not rec[4] then
        redis.call('HINCRBY', KEYS[3], 'n', 1)
        redis.call('HSET', KEYS[3], 'a:' .. ARGV[1], '1')
        local pttl = redis.call('PTTL', KEYS[1])
        if pttl >= 0 and pttl < lease then
          redis.call('PEXPIRE', KEYS[1], lease)
          redis.call('PEXPIRE', KEYS[3], lease)
          local keep = lease + tonumber(ARGV[3])
          local spttl = redis.call('PTTL', KEYS[2])
          if spttl >= 0 and spttl < keep then
            redis.call('PEXPIRE', KEYS[2], keep)
          end
        end
      end
      return {2, tonumber(rec[3]), cur}
    end
  end
  if life then
    return enqueue()
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if ordered then
  -- Free, and this caller respects the queue: if others are queued ahead
  -- of it, the first live one gets the lock and this caller is refused (a
  -- queued one stays queued).
  local head = redis.pcall('ZRANGE', KEYS[4], 0, 0)
  if type(head) == 'table' and not head.err and head[1] and head[1] ~= ARGV[1]
      and hand_over(ARGV[6], ARGV[7], tonumber(ARGV[3])) then
    if redis.call('GET', KEYS[1]) == ARGV[1] then
      -- Every entry ahead had lapsed: the grant went to this caller.
      local _, g = read_state(KEYS[2], 'token state')
      return {3, g, redis.call('PTTL', KEYS[1])}
    end
    if life then
      return enqueue()
    end
    return {0, redis.call('PTTL', KEYS[1])}
  end
end
local n, bad = read_state(KEYS[2], 'token state')
if not n then
  return bad
end
local now = now_us()
local token, err = next_token(n, now)
if not token then
  return err
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', lease)
-- Taken while free: this holder waits no more.
dequeue()
local ts = num(token)
redis.call('SET', KEYS[2], state(token, token, mark(ARGV[1]), ts),
  'PX', keep_ms(token, now, lease, tonumber(ARGV[3])))
if owner ~= '' then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'o', owner, 'h', ARGV[1], 't', ts, 'n', 1, 'a:' .. ARGV[1], '1')
  redis.call('PEXPIRE', KEYS[3], lease)
end
if n == 0 then
  -- No token state was found: the token came from the clock alone.
  return {1, token, 1}
end
return {1, token}
