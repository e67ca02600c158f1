-- Delete the lock only if this grant still holds it.
-- KEYS[1] lock key; ARGV[1] holder id. Returns 1 if released, 0 if not held.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
