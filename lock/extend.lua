-- Reset the lease of a lock only if this grant still holds it; the token is
-- untouched, and the token state is kept at least the lease plus the
-- retention. KEYS[1] lock key, KEYS[2] token state, KEYS[3] (optional) the
-- hold record of an owner's lock, which expires with the lock; ARGV[1]
-- holder id, ARGV[2] lease in ms, ARGV[3] token retention in ms.
-- Returns 1 if extended, 0 if not held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local holds = KEYS[3] and redis.pcall('HGET', KEYS[3], 'h') == ARGV[1]
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if holds then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
local keep = tonumber(ARGV[2]) + tonumber(ARGV[3])
local pttl = redis.call('PTTL', KEYS[2])
if pttl >= 0 and pttl < keep then
  redis.call('PEXPIRE', KEYS[2], keep)
end
return 1
