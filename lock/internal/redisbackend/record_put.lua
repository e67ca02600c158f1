-- Record the leader of a term next to its lock, and announce it.
-- KEYS[1] the election's lock key, KEYS[2] its leader record (a hash: v the
-- leader's value, t the term's token, h the term's holder id); both carry
-- the election's hash tag, so they are in one slot.
-- ARGV[1] holder id, ARGV[2] token, ARGV[3] value, ARGV[4] how long in ms
-- the record outlives the lock, ARGV[5] the channel that announces new
-- leaders, ARGV[6] '1' to publish sharded (SPUBLISH).
-- Returns 1 when the record names this term (written now, or by an earlier
-- run of this call that a client retry repeats), 0 when the lock is no
-- longer this term's (nothing written), and {-1, token} when the record
-- already names a newer term (the server's clock went back after Redis
-- lost the lock's token state): nothing written, and the caller advances
-- the token state past that token.
-- Admission by token: a record is replaced only by a higher token, so a
-- deposed leader can never write over a newer one's record, even if it
-- came back with the lock somehow. Every check comes before the first write.
local ok, cur = pcall(redis.call, 'GET', KEYS[1])
if not ok or cur ~= ARGV[1] then
  return 0
end
local token = tonumber(ARGV[2])
local rec = redis.call('HMGET', KEYS[2], 't', 'h')
local life = redis.call('PTTL', KEYS[1])
if life < 0 then
  life = 0
end
life = life + tonumber(ARGV[4])
if rec[1] then
  local was = tonumber(rec[1])
  if was > token or (was == token and rec[2] ~= ARGV[1]) then
    return {-1, rec[1]}
  end
  if was == token then
    redis.call('PEXPIRE', KEYS[2], life)
    return 1
  end
end
redis.call('HSET', KEYS[2], 'v', ARGV[3], 't', ARGV[2], 'h', ARGV[1])
redis.call('PEXPIRE', KEYS[2], life)
local msg = ARGV[2] .. ' ' .. ARGV[3]
if ARGV[6] == '1' then
  redis.call('SPUBLISH', ARGV[5], msg)
else
  redis.call('PUBLISH', ARGV[5], msg)
end
return 1
