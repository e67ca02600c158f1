-- The uncontended try: grant the lock and issue its fencing token in one
-- step, for a caller that names no owner and does not join the wait queue
-- (TryAcquire, and Acquire's tries before it queues or while it polls).
-- Runs after tokenstate.lua. It does what acquire.lua does for such a
-- caller, with fewer calls: a free lock and no queue (the common case)
-- cost one EXISTS for both, the token state, the clock and the two writes.
-- KEYS[1] lock key, KEYS[2] token state, KEYS[3] (optional) wait queue:
-- a caller that gives it respects the queue.
-- ARGV[1] holder id, ARGV[2] lease in ms, ARGV[3] the lease plus the token
-- retention in ms: how long the token state lives after a grant whose
-- token is not ahead of the clock. Both are sent as strings and passed on
-- as they are: a number from Lua would cost Redis a conversion per call.
-- Returns {1, token} when granted (try_fast.lua: the token alone, as a
-- bulk string; {1, token, 1} when no token state was
-- found, so the token came from the clock), {0, remaining ms of the
-- current holder} when not (-1: the current holder set no expiry), {1, 0}
-- for a retried grant of this holder whose token state was lost (the
-- caller releases it), and {4} when the lock is free but waiters are
-- queued: this script does not hand over, so the caller runs acquire.lua,
-- which grants the lock to the first live waiter ahead of it.
--
-- The queue key exists only while it holds an entry (a sorted set that
-- becomes empty is deleted), so EXISTS tells whether anyone waits. A
-- second run for the same holder id (a client retrying after a lost reply)
-- finds its own grant and returns it again instead of a refusal. Every
-- check comes before the first write: a refusal, {4} and an error change
-- nothing.

local cur = false
if redis.call('EXISTS', KEYS[1], KEYS[3] or KEYS[1]) ~= 0 then
  cur = redis.pcall('GET', KEYS[1])
  if type(cur) == 'table' and cur.err then
    return redis.error_reply('WRONGTYPE lock key ' .. KEYS[1] .. ' is not a string: ' .. cur.err)
  end
  if cur == ARGV[1] then
    local n, g, h = read_state(KEYS[2], 'token state')
    if not n then
      return g
    end
    if h ~= mark(ARGV[1]) then
      return {1, 0}
    end
    return {1, g}
  end
  if cur then
    return {0, redis.call('PTTL', KEYS[1])}
  end
  -- Free, and someone waits.
  return {4}
end
local n, bad = read_state(KEYS[2], 'token state')
if not n then
  return bad
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local token, err = next_token(n, now)
if not token then
  return err
end
-- The token is the clock unless the counter is ahead of it (a grant in the
-- same µs, or a clock that went back), and then it lives longer.
local ts, keep = nil, ARGV[3]
if token == now then
  ts = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
else
  ts = num(token)
  keep = tonumber(keep) + math.ceil((token - now) / 1000)
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ts .. ' ' .. mark(ARGV[1]), 'PX', keep)
if n == 0 then
  -- No token state was found: the token came from the clock alone.
  return {1, token, 1}
end
return {1, token}
