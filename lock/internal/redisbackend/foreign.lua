-- Issue a fencing token for the current grant of a lock that another library
-- took (redsync, redislock: SET key value NX PX), without touching that lock.
-- Runs after tokenstate.lua.
-- KEYS[1] the foreign lock key; KEYS[2] its fence record, a hash in the same
-- slot holding the newest token ("token") and the value it was issued to
-- ("value"). The record expires the retention after the lock's lease.
-- ARGV[1] the value the caller's grant stored in the lock key; ARGV[2] a
-- floor: the returned token is above it (0 for none); ARGV[3] the token
-- retention in ms.
-- Returns {1, token} while KEYS[1] holds exactly ARGV[1], else {0}.
-- The same grant gets the same token on every call (unless it is not above
-- the floor); a new value gets max(token + 1, floor + 1, server clock in µs),
-- the rule of acquire.lua. Every check comes before the first write: a
-- refused call changes nothing.
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
    if not is_token(rec[1]) then
      return redis.error_reply('WRONGTYPE fence record ' .. KEYS[2] .. ' holds token ' .. string.format('%q', rec[1]) .. ', not a token')
    end
    token = tonumber(rec[1])
  end
  value = rec[2]
end
if lockType == 'none' or redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
local floor = tonumber(ARGV[2])
local now = now_us()
local lease = math.max(redis.call('PTTL', KEYS[1]), 0)
local retention = tonumber(ARGV[3])
if value == ARGV[1] and token > floor then
  -- The same grant: keep its token, and its record as long as its lease.
  redis.call('PEXPIRE', KEYS[2], keep_ms(token, now, lease, retention))
  return {1, token}
end
-- A new grant, or a grant whose token a store has already seen surpassed.
local t, err = next_token(math.max(token, floor), now)
if not t then
  return err
end
redis.call('HSET', KEYS[2], 'token', num(t), 'value', ARGV[1])
redis.call('PEXPIRE', KEYS[2], keep_ms(t, now, lease, retention))
return {1, t}
