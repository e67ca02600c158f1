-- Lengthen the lease of a lock only if this grant still holds it; the token
-- is untouched, and the token state is kept at least the lease plus the
-- retention. KEYS[1] lock key, KEYS[2] token state, KEYS[3] (optional) the
-- hold record of an owner's lock, which expires with the lock; ARGV[1]
-- holder id, ARGV[2] lease in ms, ARGV[3] token retention in ms.
-- Returns the lock's time to live in ms after the call, at least the lease,
-- or -3 if this grant does not hold it.
--
-- An extension only ever lengthens the lock: its expiry becomes the later
-- of the current one and the lease from now. So no call shortens the lock
-- below what an earlier one was told: not another hold of an owner's lock,
-- and not an earlier extension of this lease that reaches Redis late (its
-- caller gave up on it, on another connection, and a later extension went
-- ahead). Running it twice gives the same result.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -3
end
local lease = tonumber(ARGV[2])
local pttl = redis.call('PTTL', KEYS[1])
if pttl < lease then
  redis.call('PEXPIRE', KEYS[1], lease)
  pttl = lease
end
if KEYS[3] and redis.pcall('HGET', KEYS[3], 'h') == ARGV[1] then
  local hpttl = redis.call('PTTL', KEYS[3])
  if hpttl >= 0 and hpttl < pttl then
    redis.call('PEXPIRE', KEYS[3], pttl)
  end
end
local keep = pttl + tonumber(ARGV[3])
local spttl = redis.call('PTTL', KEYS[2])
if spttl >= 0 and spttl < keep then
  redis.call('PEXPIRE', KEYS[2], keep)
end
return pttl
