-- Grant the lock and issue its fencing token in one step. Runs after
-- tokenstate.lua.
-- KEYS[1] lock key, KEYS[2] token state, KEYS[3] hold record (only with an
-- owner; all with the same hash tag, so in the same slot)
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] token retention in ms,
-- ARGV[4] owner id ('' for none)
-- Returns {1, token} when granted ({1, token, 1} when no token state was
-- found, so the token came from the clock), {0, remaining ms of the current holder}
-- when not (-1: the current holder set no expiry), {1, 0} for a grant of
-- this holder whose token state was lost (the caller releases it), and
-- {2, token, holder} when the owner re-enters the lock it holds.
--
-- With an owner, the hold record (a hash) names the owner (o), the grant's
-- holder (h) and token (t), the number of holds (n), and each acquisition
-- as a:<id> ('1' held, '0' released), where id is this call's ARGV[1]. A
-- re-entry adds a hold and extends the lock to at least its own lease; a
-- retried re-entry finds its own a:<id> and adds nothing.
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
local owner = ARGV[4]
if owner ~= '' then
  local holdType = redis.call('TYPE', KEYS[3]).ok
  if holdType ~= 'none' and holdType ~= 'hash' then
    return redis.error_reply('WRONGTYPE hold record ' .. KEYS[3] .. ' holds a ' .. holdType .. ', not a hash')
  end
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
  if owner ~= '' then
    local rec = redis.call('HMGET', KEYS[3], 'o', 'h', 't', 'a:' .. ARGV[1])
    if rec[1] == owner and rec[2] == cur then
      if not rec[4] then
        redis.call('HINCRBY', KEYS[3], 'n', 1)
        redis.call('HSET', KEYS[3], 'a:' .. ARGV[1], '1')
        local pttl = redis.call('PTTL', KEYS[1])
        if pttl >= 0 and pttl < lease then
          redis.call('PEXPIRE', KEYS[1], lease)
          redis.call('PEXPIRE', KEYS[3], lease)
          local keep = lease + tonumber(ARGV[3])
          local spttl = redis.call('PTTL', KEYS[2])
          if spttl >= 0 and spttl < keep then
            redis.call('PEXPIRE', KEYS[2], keep)
          end
        end
      end
      return {2, tonumber(rec[3]), cur}
    end
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[2], state(token, token, mark(ARGV[1])),
  'PX', keep_ms(token, now, lease, tonumber(ARGV[3])))
if owner ~= '' then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'o', owner, 'h', ARGV[1], 't', num(token), 'n', 1, 'a:' .. ARGV[1], '1')
  redis.call('PEXPIRE', KEYS[3], lease)
end
if n == 0 then
  -- No token state was found: the token came from the clock alone.
  return {1, token, 1}
end
return {1, token}
