-- Extend the lease of a lock only if this grant still holds it; the token is
-- untouched, and the token state is kept at least the lease plus the
-- retention. KEYS[1] lock key, KEYS[2] token state, KEYS[3] (optional) the
-- hold record of an owner's lock, which expires with the lock; ARGV[1]
-- holder id, ARGV[2] lease in ms, ARGV[3] token retention in ms.
-- Returns 1 if extended, 0 if not held.
--
-- Without a hold record the lock is reset to the lease from now. With one
-- (an owner's lock, which several holds share) the lock is only ever
-- lengthened: its expiry becomes the later of the current one and the lease
-- from now, so no hold's call shortens the lock below what another hold was
-- told. Running it twice gives the same result.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local lease = tonumber(ARGV[2])
if KEYS[3] then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl >= 0 and pttl < lease then
    redis.call('PEXPIRE', KEYS[1], lease)
  else
    lease = pttl
  end
  if lease >= 0 and redis.pcall('HGET', KEYS[3], 'h') == ARGV[1] then
    local hpttl = redis.call('PTTL', KEYS[3])
    if hpttl >= 0 and hpttl < lease then
      redis.call('PEXPIRE', KEYS[3], lease)
    end
  end
else
  redis.call('PEXPIRE', KEYS[1], lease)
end
if lease >= 0 then
  local keep = lease + tonumber(ARGV[3])
  local spttl = redis.call('PTTL', KEYS[2])
  if spttl >= 0 and spttl < keep then
    redis.call('PEXPIRE', KEYS[2], keep)
  end
end
return 1
