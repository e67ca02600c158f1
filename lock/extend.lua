-- Reset the lease of a lock only if this grant still holds it; the token is
-- untouched. KEYS[1] lock key; ARGV[1] holder id, ARGV[2] lease in ms.
-- Returns 1 if extended, 0 if not held.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
