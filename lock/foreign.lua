-- Issue a fencing token for the current grant of a lock that another library
-- took (redsync, redislock: SET key value NX PX), without touching that lock.
-- KEYS[1] the foreign lock key; KEYS[2] its fence record, a hash in the same
-- slot holding the counter ("token") and the value it was last issued to
-- ("value"). It never expires: the counter must never go back.
-- ARGV[1] the value the caller's grant stored in the lock key; ARGV[2] a
-- floor: the returned token is above it (0 for none).
-- Returns {1, token} while KEYS[1] holds exactly ARGV[1], else {0}.
-- The same grant gets the same token on every call (unless it is not above
-- the floor); a new value gets the next token. Every check comes before the
-- first write: a refused call changes nothing.
local lockType = redis.call('TYPE', KEYS[1]).ok
if lockType ~= 'none' and lockType ~= 'string' then
  return redis.error_reply('WRONGTYPE lock key ' .. KEYS[1] .. ' holds a ' .. lockType .. ', not a string')
end
local recType = redis.call('TYPE', KEYS[2]).ok
if recType ~= 'none' and recType ~= 'hash' then
  return redis.error_reply('WRONGTYPE fence record ' .. KEYS[2] .. ' holds a ' .. recType .. ', not a hash')
end
local token, value = 0, false
if recType == 'hash' then
  local rec = redis.call('HMGET', KEYS[2], 'token', 'value')
  if rec[1] then
    if not string.match(rec[1], '^%d+$') then
      return redis.error_reply('WRONGTYPE fence record ' .. KEYS[2] .. ' holds token ' .. string.format('%q', rec[1]) .. ', not a non-negative integer')
    end
    token = tonumber(rec[1])
  end
  value = rec[2]
end
if lockType == 'none' or redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
local floor = tonumber(ARGV[2])
if value == ARGV[1] and token > floor then
  return {1, token}
end
-- A new grant, or a grant whose token a store has already seen surpassed.
-- The floor is copied as a string so that large tokens keep every digit.
if floor > token then
  redis.call('HSET', KEYS[2], 'token', ARGV[2])
end
local next = redis.call('HINCRBY', KEYS[2], 'token', 1)
redis.call('HSET', KEYS[2], 'value', ARGV[1])
return {1, next}
