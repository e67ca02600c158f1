-- Remaining lease of this grant in ms, or -3 if it no longer holds the lock.
-- KEYS[1] lock key; ARGV[1] holder id.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -3
