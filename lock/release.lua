-- Delete the lock only if this grant still holds it, and announce the
-- release to waiters in the same step.
-- KEYS[1] lock key, KEYS[2] hold record (see acquire.lua; only with an
-- acquisition id); ARGV[1] holder
-- id ('' with an acquisition id: the holder the hold record names),
-- ARGV[2] release channel (same hash tag), ARGV[3] '1' to publish on the
-- sharded channel (SPUBLISH, cluster), ARGV[4] acquisition id of an
-- owner's hold ('' for a lock without owner).
-- Returns 1 if released, 0 if not held. With an acquisition id it releases
-- that one hold, and the lock only with the last one; a retried release
-- of a hold that is still counted elsewhere returns 1 again.
local holder = ARGV[1]
local acq = ARGV[4]
if acq ~= '' then
  local rec = redis.call('HMGET', KEYS[2], 'h', 'a:' .. acq)
  if holder == '' then
    holder = rec[1]
  end
  if not holder or redis.call('GET', KEYS[1]) ~= holder then
    return 0
  end
  if rec[1] == holder then
    if rec[2] == '0' then
      return 1
    end
    if rec[2] ~= '1' then
      return 0
    end
    if redis.call('HINCRBY', KEYS[2], 'n', -1) > 0 then
      redis.call('HSET', KEYS[2], 'a:' .. acq, '0')
      return 1
    end
  end
  redis.call('DEL', KEYS[2])
elseif redis.call('GET', KEYS[1]) ~= holder then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' then
  redis.call('SPUBLISH', ARGV[2], '')
else
  redis.call('PUBLISH', ARGV[2], '')
end
return 1
