-- Grant the lock and issue its fencing token in one step.
-- KEYS[1] lock key, KEYS[2] counter key (same hash tag, so same slot)
-- ARGV[1] holder id, ARGV[2] lease in milliseconds
-- Returns {1, token} when granted, {0, remaining ms of the current holder}
-- when not (-1: the current holder set no expiry).
-- A second run for the same holder id (a client retrying after a lost reply)
-- finds its own grant and returns it again instead of a refusal.
-- Every check comes before the first write: a failed call changes nothing.
local lockType = redis.call('TYPE', KEYS[1]).ok
if lockType ~= 'none' and lockType ~= 'string' then
  return redis.error_reply('WRONGTYPE lock key ' .. KEYS[1] .. ' holds a ' .. lockType .. ', not a string')
end
local counterType = redis.call('TYPE', KEYS[2]).ok
if counterType ~= 'none' and counterType ~= 'string' then
  return redis.error_reply('WRONGTYPE token counter ' .. KEYS[2] .. ' holds a ' .. counterType .. ', not an integer')
end
if counterType == 'string' then
  local v = redis.call('GET', KEYS[2])
  if not string.match(v, '^%d+$') then
    return redis.error_reply('WRONGTYPE token counter ' .. KEYS[2] .. ' holds ' .. string.format('%q', v) .. ', not a non-negative integer')
  end
end
if lockType == 'string' then
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    -- No other grant can INCR while this one holds the lock, so the counter
    -- is still this grant's token.
    return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, redis.call('INCR', KEYS[2])}
