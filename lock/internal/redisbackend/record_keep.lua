-- Keep a term's leader record as long as its lock, plus a margin.
-- KEYS[1] the lock key, KEYS[2] the leader record; ARGV[1] holder id,
-- ARGV[2] how long in ms the record outlives the lock.
-- Returns 1 when the record was kept, 0 when the lock or the record is no
-- longer this term's (nothing changed). Running it twice changes nothing
-- more than running it once.
local ok, cur = pcall(redis.call, 'GET', KEYS[1])
if not ok or cur ~= ARGV[1] or redis.call('HGET', KEYS[2], 'h') ~= ARGV[1] then
  return 0
end
local life = redis.call('PTTL', KEYS[1])
if life < 0 then
  life = 0
end
redis.call('PEXPIRE', KEYS[2], life + tonumber(ARGV[2]))
return 1
