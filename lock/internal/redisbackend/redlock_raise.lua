-- Raise one node's token state to the token a Redlock grant took: the
-- largest of the tokens its nodes issued. Runs after tokenstate.lua.
-- KEYS[1] token state, KEYS[2] lock key (same hash tag); ARGV[1] holder id,
-- ARGV[2] the grant's token (a decimal below 2^53-1), ARGV[3] token
-- retention in ms.
-- While the grant holds this node's lock and the state names it, both the
-- counter and the grant's token become at least ARGV[2], so a client retry
-- of this node's acquisition returns the grant's token, not the node's own.
-- Otherwise only the counter is raised, as advance.lua does. Nothing is ever
-- lowered, so running it twice changes nothing more.
-- Returns 1 when the grant's token was raised (or already there), 0 when
-- only the counter was.
local n, g, h = read_state(KEYS[1], 'token state')
if not n then
  return g
end
local want = tonumber(ARGV[2])
local cur = redis.pcall('GET', KEYS[2])
local mine = h == mark(ARGV[1]) and cur == ARGV[1]
local result = 0
if mine then
  result = 1
end
if n >= want and (not mine or g >= want) then
  return result
end
local top = math.max(n, want)
local keep = keep_ms(top, now_us(), 0, tonumber(ARGV[3]))
local pttl = redis.call('PTTL', KEYS[1])
if pttl > keep then
  keep = pttl
end
local v = num(top)
if mine then
  v = state(top, math.max(g, want), h)
elseif h then
  v = state(top, g, h)
end
redis.call('SET', KEYS[1], v, 'PX', keep)
return result
