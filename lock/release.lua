-- Delete the lock only if this grant still holds it, and announce the
-- release to waiters in the same step.
-- KEYS[1] lock key; ARGV[1] holder id, ARGV[2] release channel (same hash
-- tag), ARGV[3] '1' to publish on the sharded channel (SPUBLISH, cluster).
-- Returns 1 if released, 0 if not held.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[3] == '1' then
  redis.call('SPUBLISH', ARGV[2], '')
else
  redis.call('PUBLISH', ARGV[2], '')
end
return 1
