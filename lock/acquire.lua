-- Grant the lock and issue its fencing token in one step. Runs after
-- tokenstate.lua.
-- KEYS[1] lock key, KEYS[2] token state (same hash tag, so same slot)
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] token retention in ms
-- Returns {1, token} when granted, {0, remaining ms of the current holder}
-- when not (-1: the current holder set no expiry), {1, 0} for a grant of
-- this holder whose token state was lost (the caller releases it).
-- The token is max(n + 1, server clock in µs): above every earlier token
-- while the state lives, and above every earlier token once it has expired
-- or was lost, as long as the clock has not gone back past them.
-- A second run for the same holder id (a client retrying after a lost reply)
-- finds its own grant and returns it again instead of a refusal.
-- Every check comes before the first write: a refused call changes nothing.
local n, g, h = read_state(KEYS[2], 'token state')
if not n then
  return g
end
local now = now_us()
local token, err = next_token(n, now)
if not token then
  return err
end
local lease = tonumber(ARGV[2])
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', lease) then
  -- Held. Wrong-typed lock keys fail here, before any write.
  local cur = redis.pcall('GET', KEYS[1])
  if type(cur) == 'table' and cur.err then
    return redis.error_reply('WRONGTYPE lock key ' .. KEYS[1] .. ' is not a string: ' .. cur.err)
  end
  if cur == ARGV[1] then
    if h == mark(ARGV[1]) then
      return {1, g}
    end
    return {1, 0}
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[2], state(token, token, mark(ARGV[1])),
  'PX', keep_ms(token, now, lease, tonumber(ARGV[3])))
return {1, token}
