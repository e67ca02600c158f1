-- Change the value of the leader record of the term that holds the lock,
-- and announce it.
-- KEYS[1] the election's lock key, KEYS[2] its leader record.
-- ARGV[1] holder id, ARGV[2] token, ARGV[3] the new value, ARGV[4] the
-- announcement channel, ARGV[5] '1' to publish sharded (SPUBLISH).
-- Returns 1 when the record names this term with the new value (changed
-- now, or by an earlier run of this call that a client retry repeats: then
-- nothing is written or announced again), 0 when the lock or the record is
-- no longer this term's (nothing written). Each change counts up the
-- record's n, and the announcement is 'token.n value', so that observers
-- order a term's values. Every check comes before the first write.
local ok, cur = pcall(redis.call, 'GET', KEYS[1])
if not ok or cur ~= ARGV[1] then
  return 0
end
local rec = redis.call('HMGET', KEYS[2], 't', 'h', 'v')
if rec[1] ~= ARGV[2] or rec[2] ~= ARGV[1] then
  return 0
end
if rec[3] == ARGV[3] then
  return 1
end
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[2], 'v', ARGV[3])
local msg = ARGV[2] .. '.' .. n .. ' ' .. ARGV[3]
if ARGV[5] == '1' then
  redis.call('SPUBLISH', ARGV[4], msg)
else
  redis.call('PUBLISH', ARGV[4], msg)
end
return 1
