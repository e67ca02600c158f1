-- Delete the lock only if this grant still holds it and, in the same step,
-- hand it to the first live waiter in the resource's queue, or announce
-- that it is free to waiters queued that are no longer live. Runs after
-- release_plain.lua (the uncontended release, done before the helpers are
-- made), tokenstate.lua and handover.lua.
-- KEYS[1] lock key; then, all optional (with the same hash tag): KEYS[2]
-- token state, KEYS[3] hold record, KEYS[4] wait queue, KEYS[5] waiter
-- entries (see acquire.lua).
-- ARGV[1] holder id ('' with an acquisition id: the holder the hold record
-- names), ARGV[2] how releases are announced and whether the lock may be
-- handed over: 'p' (PUBLISH) or 's' (SPUBLISH, on a cluster) followed by
-- the token retention in ms; without the retention (Redlock) the lock is
-- never handed over and every release is announced. ARGV[3] (optional)
-- the acquisition id of an owner's hold ('' or absent for a lock without
-- owner), ARGV[4] (optional) '1' when a waiter gives up: its queue entry
-- goes too. The channel is the lock key with "lock" at its end replaced by
-- "released" (see Locker.ReleaseChannel): one argument fewer on every
-- release. Every argument costs Redis a string and a place in ARGV (about
-- 1.3k instructions), so the plain release sends the first two only.
-- Returns 1 if released, 0 if not held. With an acquisition id it releases
-- that one hold, and the lock only with the last one; a retried release
-- of a hold that is still counted elsewhere returns 1 again.
--
-- Hand-over (handover.lua): the lock goes to the first live queued waiter,
-- and the grant is published, followed, when the new lease is shorter than
-- a queue refresh, by the names of the waiters now first and the new
-- lease's length (announce_queue). When waiters were queued but none is live,
-- an empty message says the lock is free. With nobody queued nothing is
-- published: every waiter that relies on the channel is in the queue (a
-- waiter joins it in the same try that is refused, once its subscription
-- is confirmed, and tries again at that confirmation), so the message
-- would wake nobody, and an uncontended release skips the PUBLISH.
-- Hand-over never fails the release: when the token state cannot be read
-- or the token space is spent, the lock is simply freed.

local channel = string.sub(KEYS[1], 1, -5) .. 'released'
local sharded = ''
if string.sub(ARGV[2], 1, 1) == 's' then
  sharded = '1'
end

-- not_held is the reply when this grant does not hold the lock; a waiter
-- giving up leaves the queue then, and when it was among the first three
-- the waiters now first are told at once where they stand (with the lock
-- free, the new first tries at once), so leaving costs the others nothing.
-- A retried run finds the entry gone and announces nothing again.
local function not_held()
  if ARGV[4] == '1' and KEYS[5] then
    -- A waiter's queue id is its holder id, which is also its acquisition
    -- id when it names an owner.
    local me = ARGV[1]
    if me == '' then
      me = ARGV[3] or ''
    end
    redis.pcall('HDEL', KEYS[5], me)
    local rank = redis.pcall('ZRANK', KEYS[4], me)
    if type(rank) == 'number' then
      redis.pcall('ZREM', KEYS[4], me)
      if rank <= 2 then
        announce_queue(channel, sharded)
      end
    end
  end
  return 0
end

local holder = ARGV[1]
local acq = ARGV[3] or ''
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
elseif not held_by_caller and redis.call('GET', KEYS[1]) ~= holder then
  return not_held()
end
local retention = tonumber(string.sub(ARGV[2], 2))
-- Redlock passes the lock key alone and no retention: nothing to hand
-- over, and the release is always announced.
if not (KEYS[5] and retention) then
  redis.call('DEL', KEYS[1])
  publish(channel, sharded, '')
  return 1
end
local granted, waited = hand_over(channel, sharded, retention)
if not granted then
  redis.call('DEL', KEYS[1])
  if waited then
    publish(channel, sharded, '')
  end
end
return 1
